# Per-tag wakes after a level-1 sleep, with PyTorch's cache filled by the trainer meanwhile
# (test_sleep_check.py test_per_tag_wake). A vllm_scenario body (after
# tests/support/children/vllm_scenario_prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, dev, free, gen, new_llm

llm = new_llm()
llm.sleep(level=1)
# the trainer fills the cache of PyTorch's allocator meanwhile (freed blocks it keeps)
blk = dev.allocate(int(free() * 0.9), label="trainer"); dev.free(blk)
llm.wake_up(tags=["weights"])
llm.wake_up(tags=["weights", "kv_cache"])   # vLLM ignores the whole call: weights is awake
R["asleep"] = sorted(llm.llm_engine.model_executor.sleeping_tags)
try:
    R["tokens"] = len(gen(llm))
except RuntimeError as e:
    R["gen_error"] = str(e)
try:
    llm.wake_up(tags=["kv_cache"])
    R["tokens2"] = len(gen(llm))
except Exception as e:
    R["wake_error"] = type(e).__name__ + ": " + str(e)
# ms-swift drives the engine directly: one event per call as well
eng = llm.llm_engine
eng.sleep(1); eng.wake_up(["weights"]); eng.sleep(1)  # a sleep while partially awake
R["asleep_end"] = sorted(eng.model_executor.sleeping_tags)
R["weights_mapped"] = eng.model_executor.driver_worker.model_runner.weights_alloc.mapped
