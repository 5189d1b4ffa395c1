"""Which site speaks for its bug in ``python -m shim status`` (``_RANK``, then the site that acted most), on
the vLLM stand-in: an applied site before a waiting one (only vLLM's engine imported: its worker module not
yet), the busiest of the applied sites after a sleep and a wake (its "acted N times"), and a failed site
before every applied one (a failure is never hidden behind a site that works)."""
import pytest

from tests.support import stand_in

BODY = """
import copy
from shim.cli import status
def row(rows, bug):
    return next(line for line in status.text(rows, width=300).splitlines() if line.split()[:1] == [bug]).rstrip()
R["imported"] = row(status.site_rows(), "allocator-guard")  # vllm.v1.worker.gpu_worker not imported yet
llm = new_llm()
llm.sleep(level=1)
llm.wake_up()
rows = status.site_rows()
R["acted"] = {r["id"]: r["acted"] for r in rows if r["bug"] == "allocator-guard"}
R["slept"] = row(rows, "allocator-guard")
failed = copy.deepcopy(rows)
for r in failed:
    if r["id"] == "vllm-sleep-guard":
        r["decision"], r["reason"] = "failed", "RuntimeError: boom"
R["failed"] = row(failed, "allocator-guard")
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def test_the_site_that_speaks_for_a_bug(model_dir):
    body = "import vllm.v1.engine.llm_engine\n" + BODY
    R, proc = stand_in.run(model_dir, body, True, check=False)
    assert R is not None, proc.stderr[-3000:]
    assert R["imported"].endswith("applied [vllm-sleep-guard]"), R["imported"]  # not "waiting"
    busiest = max(R["acted"].values())
    assert busiest > min(R["acted"].values()), R["acted"]  # the sites acted unequally: the busiest one speaks
    assert R["slept"].endswith(f"applied, acted {busiest} times [2 sites]"), (R["slept"], R["acted"])
    assert "failed: RuntimeError: boom" in R["failed"] and R["failed"].endswith("[vllm-sleep-guard]"), R["failed"]
