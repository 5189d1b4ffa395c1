# One push of new KV-cache scales (every plain Attention layer's k_scale / v_scale / q_scale / prob_scale)
# into a dense fp8 model with an fp8 KV cache through shim.vllm.reload.session, as a trainer's push writes
# them: one model.load_weights([(name, tensor)]) per tensor. TEST_FALLBACK=1: vLLM's reload refuses to start,
# so the session re-processes the touched attention layers itself (test_reprocess_signature.py). R["derived"]:
# whether every layer's derived scales (the buffers, the host floats and tensors the kernels read) are the
# pushed ones. A stand_in body (after tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, gen, new_llm, runner

import vllm.model_executor.model_loader.reload as layerwise_reload
from vllm.model_executor.layers.attention import Attention

from shim.vllm import reload

llm = new_llm(kv_cache_dtype="fp8")
r = runner(llm)


def refuse(model, *args, **kwargs):
    raise RuntimeError("layerwise reload unavailable here")


if os.environ.get("TEST_FALLBACK") == "1":
    layerwise_reload.initialize_layerwise_reload = refuse
    if hasattr(layerwise_reload, "start_reload"):  # 0.34's entry point, tried first
        layerwise_reload.start_reload = refuse
layers = [m for m in r.model.modules() if isinstance(m, Attention)]
SCALES = {"k_scale": 0.5, "v_scale": 0.25, "q_scale": 0.125, "prob_scale": 2.0}
R["layers"] = len(layers)
R["before"] = [layers[0]._k_scale_float, layers[0]._v_scale_float]  # derived from the checkpoint (no scales: 1.0)
new = [(n, torch.tensor(SCALES[n.rsplit(".", 1)[1]])) for n, _ in r.model.named_parameters()
       if n.rsplit(".", 1)[1] in SCALES]
with reload.session(llm):
    for name, tensor in new:
        r.model.load_weights([(name, tensor)])
R["pushed"] = len(new) == 4 * len(layers) and all(
    float(getattr(m, n)) == v for m in layers for n, v in SCALES.items())
R["derived"] = all(
    (m._k_scale_float, m._v_scale_float, m._q_scale_float) == (0.5, 0.25, 0.125)
    and [float(m._k_scale), float(m._v_scale), float(m._q_scale), float(m._prob_scale)] == [0.5, 0.25, 0.125, 2.0]
    and [float(m._k_scale_cpu), float(m._v_scale_cpu)] == [0.5, 0.25] for m in layers)
R["tokens"] = len(gen(llm))
