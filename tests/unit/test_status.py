"""``python -m shim status`` as a user reads it: verification asked for but checking nothing says so."""
import json
import os
import subprocess
import sys

from tests.support import stand_in
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


def shim_status(*args, path=()):
    proc = subprocess.run([sys.executable, "-m", "shim", "status", *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=600, env=clean_env(PYTHONPATH=os.pathsep.join([*path, str(REPO)])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_default_view_is_what_is_installed_here_within_100_columns():
    """Issue 29 item 4: ``status`` was 68 rows, 207 characters wide, whatever was installed. On the vLLM
    stand-in without TRL: the vLLM rows, no TRL row, one line counting the rest; ``--all``: every row;
    both within 100 columns; ``--json`` still every row for machines."""
    site = stand_in.site()
    rows = json.loads(shim_status("--json", path=[site]))
    assert {r["id"] for r in rows} >= {"vllm-sleep-guard", "trl-stale-weights", "swift-level2-resync"}
    absent = [r for r in rows if r["installed"] is None]
    assert absent and not any(r["distribution"] == "vllm" for r in absent)
    out = shim_status(path=[site]).splitlines()
    assert max(map(len, out)) <= 100, out
    bugs = [line.split()[0] for line in out[1:-1] if line[:1].strip()]
    assert out[0].split()[0] == "bug" and len(bugs) == len(set(bugs)), out  # issue 28: one row per bug
    assert set(bugs) == {r["bug"] for r in rows if r["installed"]} and "allocator-guard" in bugs, out
    hidden = {r["bug"] for r in absent} - set(bugs)
    assert out[-1].startswith(f"{len(hidden)} more bugs for distributions not installed here (trl, ms-swift, ")
    assert out[-1].endswith("): python -m shim status --all"), out[-1]
    assert "vllm" not in out[-1].split("(")[1].split(")")[0].split(", "), out[-1]  # installed: not counted
    full = shim_status("--all", path=[site]).splitlines()
    assert max(map(len, full)) <= 100, full
    assert {line.split()[0] for line in full[1:] if line[:1].strip()} == {r["bug"] for r in rows}
    guard = [r for r in rows if r["bug"] == "allocator-guard"]  # --json: every site, with its bug's reference
    assert [r["id"] for r in guard] == ["vllm-sleep-guard", "vllm-worker-sleep-guard", "vllm-ascend-worker-sleep-guard"]
    assert {r["reference"] for r in guard} == {"https://github.com/modelscope/ms-swift/issues/6636"}


def test_a_bug_row_names_the_site_that_acted():
    """Issue 28 item 1: one row per bug, and the site that decided where the bug has several (TRL 1.9.2: the
    LoRA merge drift is fixed by its 0.28-1.10 site; the allocator guard applied on two of its three sites)."""
    out = shim_status("--import", path=[str(trl_path("1.9.2")), stand_in.site()])
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line[:1].strip()}
    assert rows["trl-lora-drift"].rstrip().endswith("applied [trl-lora-merge-drift-sync]"), out
    assert rows["allocator-guard"].rstrip().endswith("applied [2 sites]"), out
    assert rows["trl-stale-weights"].rstrip().endswith("applied"), out


def test_sites_on_request_under_their_bug():
    """Issue 28 done-when: one row per bug, its sites on request (``--sites``): each site of a bug under the
    bug's row with its own decision, here the allocator guard applied on two of its three sites."""
    path = [str(trl_path("1.9.2")), stand_in.site()]
    plain = shim_status("--import", path=path).splitlines()
    assert not any(line.lstrip().startswith("- ") for line in plain), plain  # sites only on request
    out = shim_status("--import", "--sites", path=path).splitlines()
    assert max(map(len, out)) <= 100, out
    at = next(i for i, line in enumerate(out) if line.split()[:1] == ["allocator-guard"])
    sites = [line.split() for line in out[at + 1:at + 4]]
    assert [s[:2] for s in sites[:2]] == [["-", "vllm-sleep-guard"], ["-", "vllm-worker-sleep-guard"]], out[at:at + 4]
    assert [s[-1] for s in sites[:2]] == ["applied", "applied"] and sites[2][0] != "-", out[at:at + 4]
    every = shim_status("--import", "--sites", "--all", path=path).splitlines()  # vllm-ascend's site too
    at = next(i for i, line in enumerate(every) if line.split()[:1] == ["allocator-guard"])
    assert every[at + 3].split()[:2] == ["-", "vllm-ascend-worker-sleep-guard"], every[at:at + 4]
    assert "stand down: not installed" in every[at + 3], every[at + 3]
    def bugs(lines):
        return [line.split()[0] for line in lines[1:] if line[:1].strip() and not line.startswith("- ")]
    assert bugs(out) == bugs(plain), (out, plain)  # the same bug rows, in the same order


def test_decisions_read_from_inside_a_job():
    """Issue 29 item 5: a training script reads the shim's decisions through one documented function
    (``shim.decisions()``) instead of ``shim/cli/status.py``: the same rows as ``status --json``, this process's."""
    from tests.support.helpers import run_python

    code = ("import json, shim.auto, shim\nimport vllm.v1.engine.llm_engine\n"
            "print(json.dumps(shim.decisions()))")
    proc = run_python(code, path=[stand_in.site()], env=clean_env(SHIM_DISABLED_PATCHES="vllm-prefix-reset-check"))
    rows = {r["id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert rows["vllm-sleep-guard"]["decision"] == "applied" and rows["vllm-sleep-guard"]["bug"] == "allocator-guard"
    assert rows["vllm-prefix-reset-check"]["decision"] == "disabled", rows["vllm-prefix-reset-check"]
    assert rows["trl-stale-weights"]["decision"] == "stand down", rows["trl-stale-weights"]  # TRL not installed here
    assert set(rows["vllm-sleep-guard"]) == {"id", "bug", "reference", "kind", "distribution", "installed", "affected",
                                             "decision", "reason", "acted"}
