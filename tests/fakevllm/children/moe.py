# The stand-in's fused MoE experts against transformers' and a trainer's per-tensor push into them
# (test_fake.py test_moe_fused_experts). A test_fake.py body (after children/prelude.py).
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import MODEL, PROMPT, RESULT, model, new_llm, toks

from transformers import AutoModelForCausalLM

llm = new_llm()
m = model(llm)
RESULT["params"] = {n: list(p.shape) for n, p in m.named_parameters() if "experts" in n and "layers.0." in n}
RESULT["loader"] = all(hasattr(p, "weight_loader") for n, p in m.named_parameters() if "experts" in n)
RESULT["tokens"] = list(toks(llm))
hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
RESULT["hf"] = hf.generate(torch.tensor([PROMPT[0]["prompt_token_ids"]]), max_new_tokens=6, do_sample=False)[0, 4:].tolist()
with torch.no_grad():  # a trainer's update and its push (qwen3_moe load_weights: the experts' weight_loader)
    for p in hf.parameters():
        p.add_(0.1)
try:
    m.load_weights(list(hf.named_parameters()))
    RESULT["pushed"] = list(toks(llm)) == hf.generate(torch.tensor([PROMPT[0]["prompt_token_ids"]]),
                                                       max_new_tokens=6, do_sample=False)[0, 4:].tolist()
except Exception as exc:
    RESULT["push_error"] = f"{type(exc).__name__}: {exc}"
