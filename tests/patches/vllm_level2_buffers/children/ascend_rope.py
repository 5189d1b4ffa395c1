# vllm-ascend's module-global rope caches (vllm_ascend/ops/rotary_embedding.py ``_cos_cache`` / ``_sin_cache``)
# across a level-2 sleep and a raw push of the same weights (test_level2_tensors.py). A stand_in body (after
# tests/support/children/stand_in_prelude.py); NPU mode, a tiny DeepSeek-V2 (MLA).
import logging
from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm_ascend.ops import rotary_embedding as rope

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, new_llm, runner

lines = []
class Collect(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("shim").addHandler(Collect())
sp = SamplingParams(max_tokens=8, temperature=0.0)
def gen(llm):
    return list(llm.generate([{"prompt_token_ids": [3, 10, 11, 12, 13, 14]}], sp, use_tqdm=False)[0].outputs[0].token_ids)
llm = new_llm()
r = runner(llm)
R["recorded"] = rope._cos_cache is not None
R["one_storage"] = R["recorded"] and (
    rope._cos_cache.untyped_storage().data_ptr() == rope._sin_cache.untyped_storage().data_ptr())
before = gen(llm)
caches = {n: getattr(rope, n).clone() for n in ("_cos_cache", "_sin_cache", "_cos_sin_cache") if R["recorded"]}
params = [(n, p.detach().clone()) for n, p in r.model.named_parameters()]
llm.sleep(level=2)
llm.wake_up(tags=["weights"])
for n, t in params:                       # the trainer's push: parameters only, raw load_weights
    r.model.load_weights([(n, t)])
llm.wake_up(tags=["kv_cache"])
R["back"] = {n: torch.equal(getattr(rope, n), c) for n, c in caches.items()}
R["same_output"] = gen(llm) == before
R["kept_lines"] = [line for line in lines if "plain tensors kept" in line]
