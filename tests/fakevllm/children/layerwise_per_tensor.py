# One layerwise reload of all the weights, then one reload per tensor (test_fake.py
# test_layerwise_reload_per_tensor_corrupts_split_layers). A test_fake.py body (after children/prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, model, new_llm, toks

llm = new_llm()
runner = llm.llm_engine.model_executor.driver_worker.model_runner
params = [(n, p.detach().clone()) for n, p in model(llm).named_parameters()]
before = toks(llm)
runner.reload_weights(weights_iterator=iter(params))
RESULT["one_reload"] = toks(llm) == before
for n, t in params:
    runner.reload_weights(weights_iterator=iter([(n, t)]))
RESULT["per_tensor"] = toks(llm) == before
