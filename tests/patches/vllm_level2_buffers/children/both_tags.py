# A level-2 sleep, then one wake of both tags and the trainer's push (test_level2_buffers.py
# test_level2_wake_of_both_tags_in_one_call_restores_the_buffers). A stand_in body (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, gen, new_llm, runner

llm = new_llm()
before = gen(llm)
bufs = {n: b.clone() for n, b in runner(llm).model.named_buffers()}
params = [(n, p.clone()) for n, p in runner(llm).model.named_parameters()]
llm.sleep(level=2)
llm.wake_up(tags=["weights", "kv_cache"])  # both tags in one call: the weights wake restores the buffers
runner(llm).model.load_weights(params)
R["n_buffers"] = len(bufs)
R["kept"] = all(torch.equal(b, bufs[n]) for n, b in runner(llm).model.named_buffers())
R["same_output"] = gen(llm) == before
