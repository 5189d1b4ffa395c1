"""verl vision-language rollouts read image embeddings computed with the old weights after a weight update.

Upstream: volcengine/verl#6523 (bug), fixed by PR #6522 in 0.9.0 (``clear_kv_cache`` resets the mm and encoder caches)
Affects:  verl >=0.7.1,<0.9.0 with a vLLM rollout, images reused across steps: 0.7.1 in every flow; 0.8.0 with
          ``free_cache_engine=False``, a checkpoint-engine backend other than ``naive``, or vLLM <0.17 (0.8.0's
          ``_sleep_hybrid`` resets the encoder cache itself from vLLM 0.17)
Remove:   when the shim's minimum supported verl is >=0.9.0

Every verl weight update to a vLLM rollout ends in ``vLLMHttpServer.clear_kv_cache``, which in 0.7.1 and 0.8.0
resets only the prefix cache: the next rollout with a reused image reads the embedding of the old weights.
"""
from shim.engine.patch import Patch

ID = "verl-vlm-encoder-cache"


def probe(module):
    from shim.engine import probes

    cls = getattr(module, "vLLMHttpServer", None)
    reason = probes.missing(cls, ("clear_kv_cache",), "vLLMHttpServer", own=True) if cls is not None else \
        probes.changed("vLLMHttpServer not in verl.workers.rollout.vllm_rollout.vllm_async_server")
    if reason:
        return reason
    source, reason = probes.source(cls.clear_kv_cache, "vLLMHttpServer.clear_kv_cache")
    if source is None:
        return reason
    if "reset_encoder_cache" in source:
        return "fixed upstream (clear_kv_cache resets the encoder cache)"
    if "async def clear_kv_cache" not in source or "self.engine.reset_prefix_cache(" not in source:
        return probes.changed("vLLMHttpServer.clear_kv_cache is no coroutine resetting engine.reset_prefix_cache")
    return None


def apply(module, patcher):
    from shim.verl import encoder_cache

    patcher.wrap(module.vLLMHttpServer, "clear_kv_cache", encoder_cache.clear_kv_cache_wrapper(ID))


PATCH = Patch(
    id=ID,
    tested_at=("verl", "0.8.0"),
    issue="volcengine/verl#6523",
    distribution="verl",
    affected=">=0.7.1,<0.9.0",
    fixed_in="0.9.0",
    module="verl.workers.rollout.vllm_rollout.vllm_async_server",
    apply=apply,
    probe=probe,
    summary="after every weight update (vLLMHttpServer.clear_kv_cache): vLLM's mm and encoder caches reset, "
            "as verl 0.9.0 does, so reused images are encoded with the new weights",
    verified=("CPU: real verl 0.7.1 (sleep on and off) and 0.8.0 (`free_cache_engine=False`, sleep on with vLLM "
              "0.16) on the stand-in's `AsyncLLM` and encoder cache: a reused image gets the old weights' "
              "embedding without the shim (asserted), recomputed with it; 0.9.0 stands down"),
    changes=("`vLLMHttpServer.clear_kv_cache` (every verl weight update ends there, naive and checkpoint-engine "
             "flows): after verl's own body, on the server holding the engine, `AsyncLLM.reset_mm_cache()` then "
             "`reset_encoder_cache()` (vLLM 0.16+; older: one WARNING, the encoder cache stays), as 0.9.0's "
             "`clear_kv_cache` does. 0.7.1 and 0.8.0 pin `vllm<=0.12`: there only the mm cache can be reset "
             "`clear_kv_cache` is called by `ServerAdapter.update_weights` "
             "(`verl.workers.rollout.vllm_rollout.vllm_async_server`); the wrapper is `shim.verl.encoder_cache`; "
             "the probe stands down where `clear_kv_cache` already resets the encoder cache."),
)

PATCHES = [PATCH]
