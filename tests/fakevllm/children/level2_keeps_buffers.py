# test_fake.py test_level2_keeps_buffers: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, model, new_llm

llm = new_llm()
b0 = {n: b.clone() for n, b in model(llm).named_buffers()}
llm.sleep(level=2); llm.wake_up()
RESULT["n"] = len(b0)
RESULT["same"] = all(torch.equal(b0[n], b) for n, b in model(llm).named_buffers())
