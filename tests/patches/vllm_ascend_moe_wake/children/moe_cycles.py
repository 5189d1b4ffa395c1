# Three sleep/wake cycles of a tiny Qwen3-MoE on the real NPUWorker.wake_up (test_npu_moe_wake.py): the
# expert Parameters, their attributes and shapes after each wake, a generate; with the shim (TEST_SHIM=1)
# the patch's decision too. A stand_in body (after tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, gen, new_llm, runner

llm = new_llm()
model = runner(llm).model
def experts():
    return {n: p for n, p in model.named_parameters() if n.endswith(("w13_weight", "w2_weight"))}
slept_with = experts()
for p in slept_with.values():
    p.trainer_attached = True  # what a trainer hangs on them for its pushes (ms-swift, verl: a weight_loader)
R["n_experts"] = len(slept_with)
R["shapes"] = sorted({tuple(p.shape) for p in slept_with.values()})
R["before"] = gen(llm)
R["cycles"] = []
for level, wakes in ((1, [None]), (1, [["weights"], ["kv_cache"]]), (2, [["weights"], ["kv_cache"]])):
    llm.sleep(level=level)
    for tags in wakes:
        llm.wake_up(tags=tags)
    now = experts()
    cycle = {"level": level, "same_objects": all(now[n] is p for n, p in slept_with.items()),
             "attributes_kept": all(getattr(p, "trainer_attached", False) for p in now.values()),
             "shapes": sorted({tuple(p.shape) for p in now.values()})}
    try:
        cycle["tokens"] = gen(llm)
    except RuntimeError as exc:
        cycle["fault"] = str(exc)
    R["cycles"].append(cycle)
if os.environ.get("TEST_SHIM") == "1":  # shim off: shim.engine is never imported
    from shim.engine import registry
    R["decision"] = registry.decisions().get("vllm-ascend-moe-wake-layout").text() if registry.decisions() else None
