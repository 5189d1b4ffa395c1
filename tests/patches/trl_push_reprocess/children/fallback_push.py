# One push of new kv_b_proj weights through shim.vllm.weights.reload.session on a DeepSeek-V2 (MLA, quantized
# kv_b_proj: the derived W_UK_T / W_UV are copies), with vLLM's layerwise reload refusing to start
# (TEST_FALLBACK=1), so the session falls back to re-running the touched attention layers'
# process_weights_after_loading (test_reprocess_signature.py). R["during"]: torch's per-process memory fraction
# and vLLM 0.34's weight_update_active() as the model's load_weights sees them. A stand_in body (after
# tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, new_llm, runner

import vllm.model_executor.model_loader.reload as layerwise_reload

from shim.vllm.weights import reload

llm = new_llm()
r = runner(llm)


def refuse(model, *args, **kwargs):
    raise RuntimeError("layerwise reload unavailable here")


if os.environ.get("TEST_FALLBACK") == "1":
    layerwise_reload.initialize_layerwise_reload = refuse
    if hasattr(layerwise_reload, "start_reload"):  # 0.34's entry point, tried first
        layerwise_reload.start_reload = refuse
R["during"] = []
_load = type(r.model).load_weights


def recording_load(self, weights, *args, **kwargs):
    active = getattr(layerwise_reload, "weight_update_active", lambda: None)()
    R["during"].append([torch.cuda.get_per_process_memory_fraction(), active])
    return _load(self, weights, *args, **kwargs)


type(r.model).load_weights = recording_load
R["fraction_before"] = torch.cuda.get_per_process_memory_fraction()
new = [(n, p.detach() * 1.5 + 0.01) for n, p in r.model.named_parameters() if "kv_b_proj" in n]
try:
    with reload.session(llm):
        for name, tensor in new:
            r.model.load_weights([(name, tensor)])
    R["error"] = None
except Exception as exc:  # the push fails in the trainer's hands
    R["error"] = f"{type(exc).__name__}: {exc}"
R["pushed"] = all(torch.equal(dict(r.model.named_parameters())[n], t) for n, t in new)
R["derived"] = all(torch.equal(m.absorbed_weight(), m.kv_b_proj.weight) for m in r.mla_layers)
R["fraction_after"] = torch.cuda.get_per_process_memory_fraction()
