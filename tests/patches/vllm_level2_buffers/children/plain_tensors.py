# MLA's plain tensor attributes across a level-2 sleep and a raw push of the same weights
# (test_level2_tensors.py). A stand_in body (after tests/support/children/stand_in_prelude.py).
# TEST_SESSION=1: a push through shim.vllm.weights.reload first; TEST_ORDER: the tag woken first ("weights" default,
# or "kv_cache").
import logging
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, gen, new_llm, runner

lines = []
class Collect(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("shim").addHandler(Collect())
llm = new_llm()
r = runner(llm)
mla = r.mla_layers[0]
holder = mla.impl if mla.impl is not None else mla
R["view"] = holder.W_UV.untyped_storage().data_ptr() == mla.kv_b_proj.weight.untyped_storage().data_ptr()
if os.environ.get("TEST_SESSION") == "1":  # a push through shim.vllm.weights.reload first (trl-push-reprocess)
    from shim.vllm.weights import reload
    with reload.session(llm):
        r.model.load_weights([(n, p.detach().clone()) for n, p in r.model.named_parameters()])
before = gen(llm)
derived = [m.absorbed_weight().clone() for m in r.mla_layers]
params = [(n, p.detach().clone()) for n, p in r.model.named_parameters()]
llm.sleep(level=2)
order = os.environ.get("TEST_ORDER", "weights")
if order == "kv_cache":
    llm.wake_up(tags=["kv_cache"])
llm.wake_up(tags=["weights"])
for n, t in params:                       # the trainer's push: parameters only, raw load_weights
    r.model.load_weights([(n, t)])
if order == "weights":
    llm.wake_up(tags=["kv_cache"])
R["derived_back"] = all(torch.equal(m.absorbed_weight(), d) for m, d in zip(r.mla_layers, derived))
R["same_output"] = gen(llm) == before
R["kept_lines"] = [l for l in lines if "plain tensors kept" in l]
