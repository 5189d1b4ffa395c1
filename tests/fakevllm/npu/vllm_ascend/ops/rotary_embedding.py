"""Mirrors vllm_ascend/ops/rotary_embedding.py (vllm-ascend 0.23.0): the module-global rope caches that the
MLA / SFA attention reads, and ``AscendRotaryEmbedding.__init__``, which records them.

Upstream (read in the 0.13.0rc1, 0.13.0, 0.18.0 and 0.23.0 wheels): the module keeps ``_cos_sin_cache``,
``_cos_cache`` and ``_sin_cache`` as module globals (0.23.0 ``rotary_embedding.py:51-59``). Every
``AscendRotaryEmbedding.__init__`` (:216-231) calls ``_record_cos_sin_cache(self.cos_sin_cache)`` (:104, the
buffer itself) and ``_record_cos_and_sin_cache_interleaved(self.cos_sin_cache)`` (:118): the first call makes
``cos_sin_cache.view(-1, 2, d/2).repeat(1, 1, 2).chunk(2, dim=1)`` -- ONE new tensor (the ``repeat``), whose
two halves become ``_cos_cache`` / ``_sin_cache``; later calls return early. The model is built inside
``NPUWorker.load_model``'s ``CaMemAllocator.use_memory_pool(tag="weights")`` (0.23.0 ``worker/worker.py:681-
691``), so that tensor lies in the weights pool but belongs to no module: ``NPUWorker.sleep(level=2)`` saves
``model.named_buffers()`` only (:219-221), the pool is discarded, and ``wake_up`` (:241-277) restores the
buffers -- ``_cos_sin_cache`` among them -- but nothing writes the cos/sin caches back. The MLA and SFA
metadata builders read them at every step through ``get_cos_and_sin_mla(positions)`` (:89; callers
``attention/mla_v1.py:570``, ``:656``, ``attention/sfa_v1.py:392``). Introduced in 0.13.0 (0.13.0rc1 has
``_cos_sin_cache`` only); still there in 0.23.0 (fix proposed in vllm-ascend#17217).
(``AscendDeepseekScalingRotaryEmbedding`` records its ``cos_cached`` / ``sin_cached`` BUFFERS through
``_record_cos_and_sin_cache`` instead: those come back with the buffers; not modelled.)

The stand-in: :func:`attach` gives an MLA model's rotary embedding (transformers ``DeepseekV2RotaryEmbedding``)
vLLM's ``cos_sin_cache`` buffer ([max_positions, rope_dim] = cos | sin, in float32) and records it as
``AscendRotaryEmbedding.__init__`` does, while the runner loads the model inside the weights pool; the
``repeat`` tensor is tracked on the fake device (``FakeDevice.track``), so it is offloaded, discarded and
undefined after a re-map like the rest of the weights tag. The rotary embedding's forward then reads the
caches through :func:`get_cos_and_sin_mla` at every forward pass, as the MLA path does: a discarded cache
changes the rope of every token. vllm-ascend < 0.13.0 keeps the transformers rope (no module-global caches).
"""
from __future__ import annotations

import torch
from packaging.version import Version
from vllm import _fake

_cos_cache: torch.Tensor = None
_sin_cache: torch.Tensor = None
_cos_sin_cache: torch.Tensor = None


def has_interleaved_caches() -> bool:
    """Whether this vllm-ascend records ``_cos_cache`` / ``_sin_cache`` (0.13.0 and later)."""
    return Version(_fake.ASCEND_VERSION) >= Version("0.13.0")


def get_cos_and_sin_mla(positions, use_cache=False):
    """``get_cos_and_sin_mla`` (0.23.0 :89) without ``use_cache`` (the ``_cos_mla`` staging copy)."""
    cos = _cos_cache[positions].unsqueeze(1).unsqueeze(2)
    sin = _sin_cache[positions].unsqueeze(1).unsqueeze(2)
    return cos, sin


def _record_cos_sin_cache(cos_sin_cache):
    global _cos_sin_cache
    if _cos_sin_cache is not None:
        return
    _cos_sin_cache = cos_sin_cache


def _record_cos_and_sin_cache_interleaved(cos_sin_cache):
    """0.23.0 :118 (one new device tensor, the ``repeat``, tracked on the fake device)."""
    global _cos_cache
    global _sin_cache
    if _cos_cache is not None or _sin_cache is not None:
        return
    from vllm._fake.device import DEVICE

    hidden_dim = cos_sin_cache.shape[-1] // 2
    both = DEVICE.track(cos_sin_cache.view(-1, 2, hidden_dim).repeat(1, 1, 2), label="rope_cos_sin_interleaved")
    cos_cache, sin_cache = both.chunk(2, dim=1)
    _cos_cache = cos_cache.squeeze(1)
    _sin_cache = sin_cache.squeeze(1)


class AscendRotaryEmbedding(torch.nn.Module):
    """What the transformers rotary embedding of an MLA model becomes: its (complex) output is read from the
    module-global caches, as vllm-ascend's MLA path reads them (``get_cos_and_sin_mla``)."""

    def forward(self, x, position_ids):
        cos, sin = get_cos_and_sin_mla(position_ids)        # [B, T, 1, 1, rope_dim], halves repeated
        half = cos.shape[-1] // 2
        cos = cos.reshape(*position_ids.shape, -1)[..., :half]
        sin = sin.reshape(*position_ids.shape, -1)[..., :half]
        return torch.complex(cos.float(), sin.float()).to(x.device)


def attach(model) -> bool:
    """The runner's hook (NPU mode, an MLA model, inside the weights pool): ``AscendRotaryEmbedding.__init__``
    for the model's rotary embedding. False where there is none or vllm-ascend has no such caches."""
    rope = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rope is None or not hasattr(rope, "inv_freq") or not has_interleaved_caches():
        return False
    max_positions = int(model.config.max_position_embeddings)
    with torch.no_grad():
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, rope.inv_freq.float())
        scaling = float(getattr(rope, "attention_scaling", 1.0))
        cache = torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)  # vLLM RotaryEmbedding layout
    rope.register_buffer("cos_sin_cache", cache, persistent=False)
    rope.__class__ = type("Ascend" + type(rope).__name__, (AscendRotaryEmbedding, type(rope)), {})
    _record_cos_sin_cache(rope.cos_sin_cache)
    _record_cos_and_sin_cache_interleaved(rope.cos_sin_cache)
    return True
