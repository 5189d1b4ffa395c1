"""TRL vision-language rollouts read image embeddings computed with the old weights.

Upstream: huggingface/trl#7198 (bug, open; fix proposed in PR #7200)
Affects:  trl >=0.28.0 (VLLMGeneration, 1.16.0 included) colocate, with a trained vision tower and images
          reused across steps; vLLM >=0.17 resets the caches inside every sleep, so there the gap is a push
          without a sleep before it (vllm_enable_sleep_mode=False); vLLM 0.16 with sleep mode too
Remove:   when the shim's minimum supported trl resets the encoder cache in sync_weights

``VLLMGeneration.sync_weights`` writes the trainer's weights and resets only the
prefix cache. vLLM's encoder cache keeps each image's encoder output by content
hash across requests, so the next rollout with the same image reads the
embedding of the old vision tower. The patch wraps ``sync_weights``: after it,
in colocate mode, the engine's encoder and multi-modal caches are reset
(``shim.vllm.caches``; the shim's own push path, ``shim.trl.colocate``, does
the same while this patch is on). Stands down where ``sync_weights`` already
resets the encoder cache.
"""
from shim.engine.patch import Patch


def probe(module):
    import inspect

    cls = getattr(module, "VLLMGeneration", None)
    if cls is None or not callable(getattr(cls, "sync_weights", None)):
        return "upstream shape changed: VLLMGeneration.sync_weights not found"
    if "reset_encoder_cache" in inspect.getsource(cls.sync_weights):
        return "fixed upstream (sync_weights resets the encoder cache)"
    return None


def apply(module, patcher):
    from shim.vllm import caches

    patcher.wrap(module.VLLMGeneration, "sync_weights", caches.after_sync_weights)


PATCH = Patch(
    id="trl-vlm-encoder-cache",
    tested_at=("trl", "1.16.0"),
    issue="huggingface/trl#7198",
    distribution="trl",
    affected=">=0.28.0",
    module="trl.generation.vllm_generation",
    apply=apply,
    probe=probe,
    summary="after every weight push (colocate): vLLM's encoder and multi-modal caches reset, so reused "
            "images are encoded with the new weights",
    verified="CPU: real TRL 1.16.0 and 1.9.2 VLLMGeneration on the vLLM stand-in's encoder cache",
)

PATCHES = [PATCH]
