# A level-2 sleep, then a kv_cache-first wake and the trainer's push of the parameters
# (test_level2_buffers.py). A stand_in body (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, events, gen, new_llm, runner

llm = new_llm()
before = gen(llm)
bufs = {n: b.clone() for n, b in runner(llm).model.named_buffers()}
params = [(n, p.clone()) for n, p in runner(llm).model.named_parameters()]
R["n_buffers"] = len(bufs)
llm.sleep(level=2)
try:
    llm.wake_up(tags=["kv_cache"])
    llm.wake_up(tags=["weights"])
except RuntimeError as exc:
    R["fault"] = str(exc)
else:
    runner(llm).model.load_weights(params)   # the trainer's push: parameters only
    R["kept"] = all(torch.equal(b, bufs[n]) for n, b in runner(llm).model.named_buffers())
    R["same_output"] = gen(llm) == before
R["lost_events"] = sum(1 for e in events("buffer_restore") if e["lost"])
