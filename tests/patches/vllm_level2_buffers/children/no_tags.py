# A level-2 sleep, then one wake without tags (every tag: what ``LLM.wake_up()`` sends) and the trainer's push
# (test_level2_buffers.py test_level2_wake_without_tags_restores_buffers_and_plain_tensors). A stand_in body
# (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, gen, new_llm, runner

llm = new_llm()
r = runner(llm)
before = gen(llm)
bufs = {n: b.clone() for n, b in r.model.named_buffers()}
mla = list(getattr(r, "mla_layers", None) or [])
derived = [m.absorbed_weight().clone() for m in mla]
params = [(n, p.detach().clone()) for n, p in r.model.named_parameters()]
llm.sleep(level=2)
llm.wake_up()                              # tags=None: every tag in one call, the weights included
r.model.load_weights(params)               # the trainer's push: parameters only, raw load_weights
R["n_buffers"] = len(bufs)
R["n_mla"] = len(mla)
R["kept"] = all(torch.equal(b, bufs[n]) for n, b in r.model.named_buffers())
R["derived_back"] = all(torch.equal(m.absorbed_weight(), d) for m, d in zip(mla, derived))
R["same_output"] = gen(llm) == before
