# test_fake.py test_lora_slots_follow_the_weights_tag: a body that runs after children/prelude.py; the
# adapter's folder is TEST_ADAPTER_DIR.
import json
import os
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from vllm._fake.lora import effective_weights
from vllm.lora.request import LoRARequest

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import PROMPT, RESULT, SP, model, new_llm, toks

llm = new_llm(enable_lora=True, max_lora_rank=8)
m = model(llm)
runner = llm.llm_engine.model_executor.driver_worker.model_runner
RESULT["base_layer"] = any(n.endswith("q_proj.base_layer.weight") for n, _ in m.named_parameters())
g = torch.Generator().manual_seed(1)
adapter, expected = {}, {}
for name, mod in m.named_modules():
    if hasattr(mod, "base_layer"):
        a = torch.randn(8, mod.input_size, generator=g) * 0.1
        b = torch.randn(mod.output_size, 8, generator=g) * 0.1
        adapter[f"base_model.model.{name}.lora_A.weight"] = a
        adapter[f"base_model.model.{name}.lora_B.weight"] = b
        expected[name + ".weight"] = mod.base_layer.weight.double() + 2.0 * b.double() @ a.double()
d = os.environ["TEST_ADAPTER_DIR"]
os.makedirs(d)
save_file(adapter, os.path.join(d, "adapter_model.safetensors"))
json.dump({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}, open(os.path.join(d, "adapter_config.json"), "w"))
lr = LoRARequest("a", 7, d)
RESULT["added"] = llm.llm_engine.add_lora(lr)
RESULT["listed"] = sorted(llm.llm_engine.list_loras())
def applied():
    runner.set_active_lora_for_request(lr)
    eff = effective_weights(m)
    return max(float((eff[k] - v).abs().max()) for k, v in expected.items())
RESULT["diff"] = applied()
RESULT["differs"] = toks(llm) != llm.generate(PROMPT, SP, use_tqdm=False, lora_request=lr)[0].outputs[0].token_ids
llm.sleep(level=1); llm.wake_up()
RESULT["diff_l1"] = applied()
llm.sleep(level=2); llm.wake_up()
RESULT["diff_l2"] = applied()
RESULT["listed_l2"] = sorted(llm.llm_engine.list_loras())
