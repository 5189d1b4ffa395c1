# MLA's derived matrices (W_UV) on the stand-in: views or copies, in the pool or not, after a raw push and
# after vLLM's layerwise reload (test_fake.py test_mla_*). A test_fake.py body (after children/prelude.py).
from typing import TYPE_CHECKING

import torch
import vllm

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, dev, model, new_llm, toks

llm = new_llm()
runner = llm.llm_engine.model_executor.driver_worker.model_runner
mla = runner.mla_layers[0]
holder = mla.impl if mla.impl is not None else mla
RESULT["n_mla"] = len(runner.mla_layers)
RESULT["view"] = holder.W_UV.untyped_storage().data_ptr() == mla.kv_b_proj.weight.untyped_storage().data_ptr()
pool = {a.ptr for a in dev.allocations.values() if a.pool is not None}
RESULT["derived_in_pool"] = holder.W_UV.untyped_storage().data_ptr() in pool
before = toks(llm)
torch.manual_seed(1)
new = [(n, p.detach() + 0.3 * torch.randn_like(p)) for n, p in model(llm).named_parameters()]
for n, t in new:
    model(llm).load_weights([(n, t)])
raw = toks(llm)
RESULT["raw_derived_follow"] = bool(torch.equal(mla.absorbed_weight(), mla.kv_b_proj.weight))
if vllm._fake.V >= vllm._fake.Version("0.16.0"):
    runner.reload_weights(weights_iterator=iter(new))
    RESULT["reload_derived_follow"] = bool(torch.equal(mla.absorbed_weight(), mla.kv_b_proj.weight))
    pool = {a.ptr for a in dev.allocations.values() if a.pool is not None}
    RESULT["reload_derived_in_pool"] = holder.W_UV.untyped_storage().data_ptr() in pool
    RESULT["reloaded"] = toks(llm)
RESULT["raw"] = raw
RESULT["before"] = before
