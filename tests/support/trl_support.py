"""Run ``tests/scenarios/trl_run.py`` against one TRL release and the vLLM stand-in."""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile

from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env, last_json, rendezvous_port, run_python, stand_in_site_dir

FAKEVLLM = REPO / "tests" / "fakevllm"
SCENARIO = REPO / "tests" / "scenarios" / "trl_run.py"


@functools.lru_cache(maxsize=None)
def fake_site(vllm_version: str, device: str = "cuda") -> str:
    """Site dir of the stand-in imitating ``vllm_version`` on ``device`` (the checked-in one: 0.24.0)."""
    if vllm_version == "0.24.0":
        return str(FAKEVLLM)
    target = stand_in_site_dir(f"fakevllm-{vllm_version}-{device}")
    if not target.exists():
        spec = importlib.util.spec_from_file_location("fakevllm_make_site", FAKEVLLM / "make_site.py")
        make_site = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_site)
        tmp = tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp")
        make_site.make_site(tmp, version=vllm_version, device=device)
        try:
            os.rename(tmp, target)
        except OSError:  # another worker won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def vllm_for(trl_version: str) -> str:
    """The vLLM version the stand-in imitates for a TRL release (one TRL supports)."""
    major_minor = tuple(int(x) for x in trl_version.split(".")[:2])
    return "0.10.2" if major_minor < (0, 27) else "0.24.0"


def run_trl(trl_version: str, out_dir, *args: str, env: dict | None = None, script=SCENARIO,
            vllm: "str | None" = None) -> dict:
    """Run ``script`` (a scenario under tests/scenarios, ``trl_run.py`` by default) with ``args`` against
    one TRL release and the stand-in of the vLLM it supports (``vllm``: another version); its JSON summary."""
    vllm_version = vllm or vllm_for(trl_version)
    environment = clean_env(FAKEVLLM_VERSION=vllm_version, TOKENIZERS_PARALLELISM="false",
                            HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                            OMP_NUM_THREADS="1", MASTER_PORT=rendezvous_port(), **(env or {}))
    path = [trl_path(trl_version), fake_site(vllm_version)]
    code = f"import runpy, sys; sys.argv = ['trl_run'] + {['--out', str(out_dir), *args]!r}; " \
           f"runpy.run_path({str(script)!r}, run_name='__main__')"
    proc = run_python(code, path=path, env=environment, timeout=900)
    return last_json(proc)
