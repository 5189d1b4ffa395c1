"""``python -m shim status`` as a user reads it: verification asked for but checking nothing says so."""
import json
import os
import subprocess
import sys

from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env
from tests.support.trl_support import fake_site


def status_rows(**env) -> dict:
    path = os.pathsep.join([str(trl_path("1.16.0")), fake_site("0.24.0"), str(REPO)])
    proc = subprocess.run([sys.executable, "-m", "shim", "status", "--json", "--import"], capture_output=True,
                          text=True, cwd=str(REPO), timeout=600,
                          env=clean_env(PYTHONPATH=path, TOKENIZERS_PARALLELISM="false", **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(proc.stdout)}


def test_verification_requested_with_its_engine_half_off_is_not_running():
    rows = status_rows(SHIM_VERIFY_WEIGHTS="1", SHIM_DISABLED_PATCHES="verify-weights-vllm")
    trl = rows["verify-weights-trl"]
    assert trl["decision"] == "requested, not running", trl
    assert "verify-weights-vllm" in trl["reason"], trl
    on = status_rows(SHIM_VERIFY_WEIGHTS="1")
    assert on["verify-weights-trl"]["decision"] == "applied", on["verify-weights-trl"]  # both halves on: running
    assert on["verify-weights-trl"]["kind"] == "feature" and on["trl-vlm-encoder-cache"]["kind"] == "fix"
