"""verl's weight update: the engine's multi-modal and encoder caches reset after it, as verl 0.9.0 does (verl#6523).

Every verl weight-update flow to a vLLM rollout ends in the rollout server's ``clear_kv_cache``, which in verl
0.7.1 and 0.8.0 resets only the prefix cache. vLLM's encoder cache keeps an image's encoder output by content
hash across requests, so the next rollout with a reused image reads the embedding of the OLD vision tower.
verl 0.9.0's ``clear_kv_cache`` (PR #6522)::

    await self.engine.reset_prefix_cache(reset_connector=True)
    await self.engine.reset_mm_cache()
    await self.engine.reset_encoder_cache()
"""
from __future__ import annotations

from shim.engine import log

ISSUE = "volcengine/verl#6523"


def _note(patch_id: str, done: list) -> None:
    if done and log.once((patch_id, "caches reset")):
        log.decision(f"{patch_id}: after verl's weight update (vLLMHttpServer.clear_kv_cache) the engine's "
                     f"{' and '.join(done)} cache(s) were reset, as verl 0.9.0 does")


def clear_kv_cache_wrapper(patch_id: str):
    """The wrapt wrapper of verl's coroutine method ``vLLMHttpServer.clear_kv_cache``.

    Where verl calls it: ``ServerAdapter.update_weights`` (``verl/workers/rollout/vllm_rollout/vllm_rollout.py``:
    after the workers loaded the pushed tensors, ``await self.server_handle.clear_kv_cache.remote()`` on
    rollout rank 0; the naive colocated push and the checkpoint-engine backends,
    ``verl/checkpoint_engine/base.py``, both call that ``update_weights``). Where verl's own sleep happens to
    drop the cache (0.8.0's ``_sleep_hybrid`` calls ``engine.reset_encoder_cache()`` with vLLM >= 0.17, whose
    ``EngineCore.sleep`` resets the caches too) the default sleep-on flow is clean; a push without that sleep
    before it is not: ``free_cache_engine=False``, a checkpoint-engine backend other than ``naive`` (no sleep:
    its ``CheckpointEngineManager.update_weights`` pauses generation, keeps the weights resident and pushes;
    what the pause clears is the vLLM version's), vLLM < 0.17, and 0.7.1's HYBRID sleep
    (``collective_rpc("sleep")`` goes to the workers, past ``EngineCore.sleep``).

    The wrapper adds 0.9.0's two resets after verl's own ``clear_kv_cache``, on the server that holds the
    engine (``node_rank == 0``, verl's own condition), through ``shim.vllm.caches``. Like 0.9.0 it runs on
    every call, so the sleep-on flow of 0.8.0 with vLLM >= 0.17 resets twice (at the sleep and after the
    push): the second reset finds the cache empty and costs two engine-core calls (verl 0.9.0 does the
    same: ``_sleep_hybrid`` and ``clear_kv_cache`` both reset). ``clear_kv_cache`` also serves verl's
    request aborts (``abort_request``; ``abort_all_requests`` on vLLM < 0.12): the resets there are
    0.9.0's as well.
    """
    from shim.vllm import caches

    def wrapper(wrapped, instance, args, kwargs):
        async def run():
            result = await wrapped(*args, **kwargs)
            try:
                engine = getattr(instance, "engine", None) if getattr(instance, "node_rank", None) == 0 else None
            except Exception as exc:  # never break verl's update
                log.warning(f"{patch_id}: could not read the rollout server ({exc}); encoder cache not reset")
                engine = None
            if engine is not None:
                _note(patch_id, await caches.reset_encoder_caches_async(engine, ISSUE))
            return result

        return run()

    return wrapper
