# test_fake.py test_npu_mode_errors: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

import vllm_ascend  # noqa: F401  (the NPU plugin loaded, as vLLM's platform detection does)
from vllm.platforms import current_platform

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, model, new_llm

RESULT["dt"] = current_platform.device_type
llm = new_llm()
try:
    llm.collective_rpc("reload_weights"); RESULT["reload"] = "ok"
except NotImplementedError as e:
    RESULT["reload"] = str(e)
llm.sleep(level=2)
m = model(llm)
try:
    m.load_weights([(n, p.clone()) for n, p in m.named_parameters()]); RESULT["write"] = "ok"
except RuntimeError as e:
    RESULT["write"] = str(e)
RESULT["alloc"] = type(llm.llm_engine.model_executor.driver_worker._allocator()).__name__
