"""The vLLM sleep scenarios: a child program on the stand-in (tests/fakevllm), shim on or off.

``scenario(model_dir, body, shim)`` runs ``PRELUDE`` (``children/vllm_scenario_prelude.py``: an engine
factory and device readings) plus ``body`` (a child file next to the test, see ``helpers.child_text``) in a
fresh interpreter and returns the child's ``R`` dict; used by the sleep-check, verdict
and fault tests.
"""
from __future__ import annotations

from tests.support.helpers import REPO, child_text, clean_env, last_json, run_python

FAKEVLLM = REPO / "tests" / "fakevllm"
GiB = 1 << 30
VALUE = "max_split_size_mb:128,expandable_segments:True"


CHILDREN = REPO / "tests" / "support" / "children"
PRELUDE = (CHILDREN / "vllm_scenario_prelude.py").read_text()
"""An engine factory and device readings (``new_llm``, ``free``, ``tracked``, ``gen``, ``R``): the program's start."""


def scenario(model_dir, body, shim: bool, check: bool = True, **env):
    base = clean_env()
    for k in list(base):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) or k in ("RANK", "LOCAL_RANK"):
            del base[k]
    base.update(VLLM_LOGGING_LEVEL="ERROR", TEST_MODEL=model_dir, TEST_SHIM="1" if shim else "0")
    base.update({k: str(v) for k, v in env.items()})
    code = PRELUDE + child_text(body) + "\nprint(json.dumps(R))\n"
    proc = run_python(code, path=[FAKEVLLM], env=base, check=check)
    return (last_json(proc) if proc.returncode == 0 else None), proc
