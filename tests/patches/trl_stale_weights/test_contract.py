"""Contract of ``shim.patches.trl_stale_weights`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("trl_stale_weights")


from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.envs import trl_path  # noqa: E402
from tests.support.helpers import clean_env, last_json, run_python  # noqa: E402
from tests.support.trl_support import fake_site  # noqa: E402

STANDS_DOWN = Path(__file__).parent / "children" / "stands_down.py"


@pytest.mark.parametrize("gate", ["range", "probe"])
def test_stands_down_on_the_fixed_release_by_behaviour(gate):
    """TRL 1.10.0 has the upstream fix: nothing of the patch is installed, whether the version range or
    (with the range widened on purpose) the probe is what stands it down."""
    proc = run_python(STANDS_DOWN.read_text(), argv=[gate], path=[trl_path("1.10.0"), fake_site("0.24.0")],
                      env=clean_env(FAKEVLLM_VERSION="0.24.0", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1"))
    out = last_json(proc)
    assert out["markers"] == {"generate": [], "sync_weights": []}, out
    assert out["decision"].startswith("stand down"), out
