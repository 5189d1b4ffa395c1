"""Run a snippet on the vLLM stand-in (tests/fakevllm) in a fresh interpreter, shim on or off.

Shared by the tests of the caches / buffers / NPU-leak patches. ``site(version, device)`` is the
stand-in's site dir for another vLLM version or NPU mode (with vllm-ascend metadata).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile

from tests.support.helpers import REPO, child_text, clean_env, last_json, run_python, stand_in_site_dir

FAKEVLLM = REPO / "tests" / "fakevllm"

PRELUDE = (REPO / "tests" / "support" / "children" / "stand_in_prelude.py").read_text()
"""An engine factory and stand-in readings (``new_llm``, ``runner``, ``events``, ``gen``, ``R``): the program's start."""


@functools.lru_cache(maxsize=None)
def site(version: str = "0.24.0", device: str = "cuda", ascend: str = "") -> str:
    """Site dir imitating vLLM ``version`` on ``device`` (NPU: vllm-ascend ``ascend`` metadata)."""
    target = stand_in_site_dir(f"fakevllm-{version}-{device}{'-' + ascend if ascend else ''}")
    if not target.exists():
        spec = importlib.util.spec_from_file_location("fakevllm_make_site", FAKEVLLM / "make_site.py")
        make_site = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_site)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp")
        make_site.make_site(tmp, version=version, device=device, ascend_version=ascend or None)
        try:
            os.rename(tmp, target)
        except OSError:  # another worker won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def run(model_dir, body, shim: bool, version: str = "0.24.0", device: str = "cuda", ascend: str = "",
        check: bool = True, **env):
    """(result dict or None, process) of ``PRELUDE + body`` printing ``R`` as its last line; ``body`` a child
    file next to the test (or several, or an inline snippet: ``helpers.child_text``)."""
    base = clean_env()
    for k in list(base):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) or k in ("RANK", "LOCAL_RANK"):
            del base[k]
    base.update(VLLM_LOGGING_LEVEL="ERROR", TEST_MODEL=str(model_dir), TEST_SHIM="1" if shim else "0",
                FAKEVLLM_VERSION=version, FAKEVLLM_DEVICE=device, OMP_NUM_THREADS="1")
    if ascend:
        base["FAKEVLLM_ASCEND_VERSION"] = ascend
    base.update({k: str(v) for k, v in env.items()})
    code = PRELUDE + child_text(body) + "\nprint(json.dumps(R))\n"
    path = [site(version, device, ascend)]
    proc = run_python(code, path=path, env=base, check=check)
    return (last_json(proc) if proc.returncode == 0 else None), proc
