"""Mirrors vllm/v1/core/encoder_cache_manager.py ``EncoderCacheManager`` (scheduler side)
together with the storage it manages, ``GPUModelRunner.encoder_cache`` (vllm/v1/worker/
gpu_model_runner.py: ``mm_hash -> encoder output``), as of vLLM 0.10.2 - 0.31.

Semantics kept from upstream:
- an entry is keyed by the multi-modal item's content hash (``mm_features[i].identifier``,
  ``MultiModalHasher`` over the item's bytes), so the SAME image in a later request -- of any
  prompt -- is served from the cache instead of running the encoder again;
- entries outlive their requests: when no request references them they become "freeable"
  and are evicted oldest first only when a new item needs the space (``can_allocate``);
- ``reset()`` (0.16+, ``EngineCore.reset_encoder_cache`` -> scheduler + runner) drops every
  entry. Nothing else invalidates an entry: a weight update does not (huggingface/trl#7198).

The fake's "encoder output" is the fingerprint of the weights it was computed with (the
fake model is text-only): a hit whose fingerprint differs from the engine's current weights
is a stale embedding. Capacity is counted in items (upstream: encoder embeddings).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict


def mm_hash(item) -> str:
    """Content hash of one multi-modal item (upstream: blake3 over the item's bytes)."""
    h = hashlib.sha256()
    tobytes = getattr(item, "tobytes", None)
    if callable(tobytes):  # PIL image / numpy array
        h.update(repr((getattr(item, "mode", None), getattr(item, "size", None))).encode())
        h.update(tobytes())
    elif hasattr(item, "numpy"):  # torch tensor
        h.update(item.detach().cpu().contiguous().numpy().tobytes())
    else:
        h.update(repr(item).encode())
    return h.hexdigest()[:16]


def mm_items(multi_modal_data) -> list:
    """The items of a prompt's ``multi_modal_data`` (``{"image": img | [img, ...], ...}``)."""
    items = []
    for _, value in sorted((multi_modal_data or {}).items()):
        items.extend(value if isinstance(value, (list, tuple)) else [value])
    return items


class EncoderCacheManager:
    def __init__(self, cache_size: int = 64):
        self.cache_size = cache_size
        self.cached: dict[str, set[str]] = {}        # mm_hash -> ids of requests referencing it
        self.freeable: OrderedDict[str, int] = OrderedDict()
        self.encoder_cache: dict[str, str] = {}      # the runner's storage: mm_hash -> output

    def lookup(self, request_id: str, key: str) -> "str | None":
        """``check_and_update_cache``: the cached output of ``key`` (now referenced), or None."""
        if key not in self.cached:
            return None
        if not self.cached[key]:
            self.freeable.pop(key, None)
        self.cached[key].add(request_id)
        return self.encoder_cache[key]

    def store(self, request_id: str, key: str, output: str) -> None:
        """``can_allocate`` + ``allocate``: evicts the oldest freeable entries when full."""
        while len(self.cached) >= self.cache_size and self.freeable:
            old, _ = self.freeable.popitem(last=False)
            self.cached.pop(old, None)
            self.encoder_cache.pop(old, None)
        self.cached[key] = {request_id}
        self.encoder_cache[key] = output

    def free_request(self, request_id: str) -> None:
        """``free``: the request finished; unreferenced entries become freeable (kept)."""
        for key, refs in self.cached.items():
            if request_id in refs:
                refs.discard(request_id)
                if not refs:
                    self.freeable[key] = 1

    def reset(self) -> None:
        self.cached.clear()
        self.freeable.clear()
        self.encoder_cache.clear()
