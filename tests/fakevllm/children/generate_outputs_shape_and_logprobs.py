# test_fake.py test_generate_outputs_shape_and_logprobs: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, SamplingParams, new_llm

llm = new_llm(logprobs_mode="processed_logprobs")
sp = SamplingParams(n=2, max_tokens=5, temperature=0.8, top_p=0.9, top_k=50, seed=3, logprobs=2)
outs = llm.generate([{"prompt_token_ids": [3, 10, 11]}, "the cat is"], sp, use_tqdm=False)
o = outs[0].outputs[0]
RESULT["n"] = [len(x.outputs) for x in outs]
RESULT["prompt_ids"] = outs[0].prompt_token_ids
RESULT["lens"] = len(o.token_ids) == len(o.logprobs)
first = o.logprobs[0]
tid = o.token_ids[0]
RESULT["sampled_in"] = tid in first and len(first) <= 3
RESULT["ranks"] = sorted(lp.rank for lp in first.values())[:2]
RESULT["finite"] = all(lp.logprob <= 0 for d in o.logprobs for lp in d.values())
again = llm.generate([{"prompt_token_ids": [3, 10, 11]}], sp, use_tqdm=False)[0].outputs[0].token_ids
RESULT["seeded"] = again == o.token_ids
ch = llm.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=3), use_tqdm=False)
RESULT["chat"] = len(ch) == 1 and len(ch[0].outputs[0].token_ids) >= 1
