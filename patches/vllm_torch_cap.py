"""vLLM 0.34's extensible KV cache caps torch for the whole process, and no sleep lifts the cap.

Upstream: vLLM 0.34.0 v1/worker/extensible_kv_cache.py (measure_kv_cache_blocks ->
          set_torch_memory_limit -> torch.cuda.set_per_process_memory_fraction; lifted only in
          kv_cache_lent_for_weight_update and free()); Worker.sleep/discard only release_physical()
Affects:  vllm >=0.34.0 on CUDA with the extensible KV cache (the default unless kv_cache_memory_bytes,
          num_gpu_blocks_override or a KV connector), the engine in the trainer's process (TRL and
          ms-swift colocate); inferred from the wheel's code, run on the stand-in only
Remove:   when vLLM lifts the cap while the worker sleeps

The worker's ``sleep`` / ``discard`` lift the cap once vLLM's call returned; ``wake_up`` puts vLLM's
value back once nothing is asleep (``shim.vllm.sleep.extensible_kv``).
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed


def _probe(module):
    worker = getattr(module, "Worker", None)
    if worker is None or not all(callable(getattr(worker, n, None)) for n in ("sleep", "wake_up", "discard")):
        return changed("no Worker.sleep/wake_up/discard")
    try:
        import vllm.v1.worker.extensible_kv_cache as ekv
    except ImportError:
        return changed("no vllm.v1.worker.extensible_kv_cache")
    cache = getattr(ekv, "ExtensibleKVCache", None)
    if cache is None or not callable(getattr(cache, "set_torch_memory_limit", None)):
        return changed("no ExtensibleKVCache.set_torch_memory_limit")
    return None


def _apply(module, patcher):
    from shim.vllm.sleep import extensible_kv

    patcher.wrap(module.Worker, "sleep", extensible_kv.on_sleep)
    patcher.wrap(module.Worker, "discard", extensible_kv.on_discard)
    patcher.wrap(module.Worker, "wake_up", extensible_kv.on_wake)


PATCH = Patch(
    id="vllm-torch-cap-sleep",
    tested_at=("vllm", "0.34.0"),
    issue="vLLM 0.34 extensible KV cache: torch's per-process cap outlives the sleep",
    distribution="vllm",
    affected=">=0.34.0",
    module="vllm.v1.worker.gpu_worker",
    apply=_apply,
    probe=_probe,
    summary="torch's per-process memory cap (set by the extensible KV cache) lifted while the worker sleeps, "
            "vLLM's value put back at the full wake",
    verified="CPU: vLLM stand-in 0.34.0 (in-process LLM: the trainer's allocation after a sleep); inferred from "
             "the 0.34.0 wheel, not run on a GPU",
)

PATCHES = [PATCH]
