# A plain tensor attribute in the weights pool across a level-2 sleep, a weights wake and a raw push of the
# same parameters (test_level2_tensors.py, the 0.33 / 0.34 cases). The attribute stands for what
# ``set_default_quant_scales(layer, register_buffer=False)`` leaves on an attention layer (``q_range`` ...):
# neither a parameter nor a buffer, allocated inside ``use_memory_pool("weights")`` at load. Also read: the
# patch's decision, whether the stale-rollout alarm would name it, and what the sleep discarded.
# A stand_in body (after tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, dev, events, gen, new_llm, runner

from vllm.device_allocator.cumem import CuMemAllocator

llm = new_llm()
r = runner(llm)
attn = r.model.model.layers[0].self_attn
with CuMemAllocator.get_instance().use_memory_pool(tag="weights"):
    attn.q_range = dev.track(torch.full((4,), 240.0), label="q_range")
before = gen(llm)
buffers = {n: b.clone() for n, b in r.model.named_buffers()}
params = [(n, p.detach().clone()) for n, p in r.model.named_parameters()]
llm.sleep(level=2)
llm.wake_up(tags=["weights"])
R["params_discarded"] = not all(torch.equal(p, t) for (_, t), (_, p) in zip(params, r.model.named_parameters()))
for n, t in params:  # the trainer's push: parameters only, raw load_weights
    r.model.load_weights([(n, t)])
llm.wake_up(tags=["kv_cache"])
R["attribute_back"] = torch.equal(attn.q_range, torch.full((4,), 240.0))
R["buffers_back"] = all(torch.equal(b, buffers[n]) for n, b in r.model.named_buffers())
R["same_output"] = gen(llm) == before
R["saved_buffers_attr"] = hasattr(llm.llm_engine.model_executor.driver_worker, "_sleep_saved_buffers")
sleeps = events("allocator_sleep")
R["discarded_allocations"] = sleeps[-1].get("discarded", 0)
if os.environ.get("TEST_SHIM") == "1":
    from shim.engine import registry
    from shim.observe import trainer_metrics

    R["decision"] = registry.decisions()["vllm-level2-tensors"].text()
    R["alarm_names_it"] = "vllm-level2-tensors" in trainer_metrics._not_acting()
