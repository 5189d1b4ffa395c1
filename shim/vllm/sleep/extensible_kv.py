"""vLLM 0.34's extensible KV cache under a sleep: torch's per-process memory cap follows the sleep (patch
``vllm-torch-cap-sleep`` on vLLM's ``Worker``), and the cache's pages, outside the sleep pool, count in the
sleep check's figures (``shim.vllm.engines.outside_pool_bytes``).

vLLM 0.34's extensible KV cache (``v1/worker/extensible_kv_cache.py``, on by default on CUDA) caps torch's
caching allocator for the whole process after warm-up (``set_torch_memory_limit`` ->
``torch.cuda.set_per_process_memory_fraction``, at "reserved now + what stays free beside the KV cache") and
lifts it only for its own reload and at ``free()``, never at a sleep. With the engine in the trainer's
process (TRL / ms-swift colocate), torch's reservation does not shrink when the pool unmaps its pages, so the
trainer cannot grow into what the sleep gave back: an OOM at the first optimizer step, or no gain from
sleeping. Here the cap is lifted while anything is asleep (:func:`lift`, :func:`restore`).
"""
from __future__ import annotations

from shim.vllm import engines
from shim.vllm.sleep import sleep_state


def lift(worker) -> None:
    """Something of ``worker`` is asleep (``sleep`` or ``discard``): its KV cache's torch cap lifted,
    vLLM's value kept."""
    kv_cache = engines.extensible_kv_cache(worker)
    limit = getattr(kv_cache, "torch_memory_limit", None)
    if limit is None:
        return
    sleep_state.state_for(worker).measure.torch_cap = limit
    kv_cache.set_torch_memory_limit(None)


def restore(worker) -> None:
    """``worker`` is fully awake: the cap vLLM set, back through vLLM's own method. A cap vLLM set in
    between (its reload restores its own) is left as vLLM set it. The sleep check's verdict on any cap
    that hides the freed memory is ``shim.vllm.sleep.sleep_verdict.capped``."""
    state = sleep_state.state_for(worker)
    limit, state.measure.torch_cap = state.measure.torch_cap, None
    kv_cache = engines.extensible_kv_cache(worker)
    if limit is not None and kv_cache is not None and getattr(kv_cache, "torch_memory_limit", None) is None:
        kv_cache.set_torch_memory_limit(limit)


def on_sleep(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    lift(instance)
    return result


on_discard = on_sleep


def on_wake(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if not _asleep(instance):
        restore(instance)
    return result


def _asleep(worker) -> bool:
    """Anything still asleep after this wake, in vLLM's own records: the KV cache without its pages, or a
    pool allocation marked ``is_asleep`` (``AllocationData``, vLLM >= 0.28)."""
    from shim.vllm.sleep import sleep_pool

    kv_cache = engines.extensible_kv_cache(worker)
    if kv_cache is not None and not getattr(kv_cache, "physical_bytes", 1):
        return True
    records = getattr(sleep_pool.allocator("cuda"), "pointer_to_data", None) or {}
    return any(getattr(d, "is_asleep", False) for d in list(records.values()))
