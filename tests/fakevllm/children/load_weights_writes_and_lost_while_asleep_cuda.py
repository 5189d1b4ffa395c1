# test_fake.py test_load_weights_writes_and_lost_while_asleep_cuda: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, fingerprint, model, new_llm, wfp

llm = new_llm()
m = model(llm)
new = [(n, torch.full_like(p, 0.01)) for n, p in m.named_parameters()]
RESULT["loaded"] = len(m.load_weights(new))
RESULT["written"] = wfp(llm) == fingerprint(new)
llm.sleep(level=2)
m.load_weights([(n, torch.full_like(p, 0.02)) for n, p in m.named_parameters()])   # lost
llm.wake_up(tags=["weights"])
RESULT["lost"] = wfp(llm) != fingerprint([(n, torch.full_like(p, 0.02)) for n, p in m.named_parameters()])
try:
    m.load_weights([("nope.weight", torch.zeros(1))]); RESULT["unknown"] = "ok"
except KeyError:
    RESULT["unknown"] = "KeyError"
