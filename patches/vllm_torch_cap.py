"""vLLM 0.34's extensible KV cache caps torch for the whole process, and no sleep lifts the cap.

Upstream: vLLM 0.34.0 v1/worker/extensible_kv_cache.py (measure_kv_cache_blocks -> set_torch_memory_limit ->
          torch.cuda.set_per_process_memory_fraction; lifted only in kv_cache_lent_for_weight_update and
          free()); Worker.sleep/discard only release_physical()
Affects:  vllm >=0.34.0 on CUDA with the extensible KV cache (the default unless kv_cache_memory_bytes,
          num_gpu_blocks_override or a KV connector), the engine in the trainer's process (TRL and
          ms-swift colocate); inferred from the wheel's code, run on the stand-in only
Remove:   when vLLM lifts the cap while the worker sleeps

A sleep gives the memory back to the device, but the cap keeps the trainer from using it: an OOM after a
sleep that freed enough.
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
    from shim.vllm import extensible_kv

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
    verified=("CPU only (vLLM 0.34 needs torch 2.14): stand-in 0.34.0, an in-process LLM: after a sleep the "
              "trainer allocates more than was free before it: OOM without the shim (asserted), fine with it; the "
              "cap lifted asleep, after a weights-only wake and after `release_kv_cache_memory`, vLLM's exact "
              "value back at the full wake; the verdict with the lift off (0.34) and with the program's own cap "
              "(0.24). Inferred from the 0.34.0 wheel (`v1/worker/extensible_kv_cache.py`), not run on a GPU"),
    changes=("vLLM 0.34's extensible KV cache caps torch's caching allocator for the whole process after warm-up "
             "(`set_torch_memory_limit` -> `set_per_process_memory_fraction`) and only its own reload and `free()` "
             "lift it. The worker's `sleep` / `discard` lift it once vLLM's call returned (vLLM's value kept on "
             "the worker's state); `wake_up` puts that value back through vLLM's own method once nothing is asleep "
             "in vLLM's records (the cache's pages, `AllocationData.is_asleep`); a cap vLLM set in between is left "
             "alone. The sleep check (any vLLM) counts the cache's pages outside the pool in `tracked`/`freed`, "
             "and warns once per engine \"freed, but this process cannot use it\" where a torch cap hides at least "
             "half of what a sleep freed The wrappers are `shim.vllm.extensible_kv`."),
)

PATCHES = [PATCH]
