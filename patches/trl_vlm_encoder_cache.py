"""TRL vision-language rollouts read image embeddings computed with the old weights.

Upstream: huggingface/trl#7198 (bug, open; fix proposed in PR #7200)
Affects:  trl >=0.28.0 (VLLMGeneration) and OnlineDPOTrainer's own push (>=0.26.0; >=0.23.0,<0.26.0; sleep mode
          off by default) colocate, with a trained vision tower and images reused across steps; vLLM >=0.17
          resets the caches inside every sleep, so there the gap is a push without a sleep before it
          (vllm_enable_sleep_mode=False); vLLM 0.16 with sleep mode too
Remove:   when the shim's minimum supported trl resets the encoder cache in sync_weights

``VLLMGeneration.sync_weights`` (and OnlineDPO's ``_move_model_to_vllm``) writes the trainer's weights and resets
only the prefix cache, while vLLM's encoder cache keeps each image's encoder output by content hash across
requests: the next rollout with the same image reads the embedding of the old vision tower.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, fixed_if_contains


def _probe(class_name: str, method: str):
    def probe(module):
        cls = getattr(module, class_name, None)
        if cls is None or not callable(getattr(cls, method, None)):
            return changed(f"{class_name}.{method} not found")
        return fixed_if_contains(getattr(cls, method), f"{class_name}.{method}", "reset_encoder_cache",
                                 f"fixed upstream ({method} resets the encoder cache)")

    return probe


probe = _probe("VLLMGeneration", "sync_weights")


def apply(module, patcher):
    from shim.vllm import caches

    patcher.wrap(module.VLLMGeneration, "sync_weights", caches.after_sync_weights)


def apply_online_dpo(module, patcher):
    from shim.vllm import caches

    patcher.wrap(module.OnlineDPOTrainer, "_move_model_to_vllm", caches.after_trainer_push)


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
    verified=("CPU: real TRL 1.16.0 and 1.9.2 `VLLMGeneration` on the stand-in's encoder cache (shared by content "
              "hash, as vLLM's `EncoderCacheManager`): the second rollout reads the image embedding of the old "
              "weights without the shim (asserted), fresh with it"),
    changes=("`VLLMGeneration.sync_weights` (and the shim's own push path): after every push the engine's encoder "
             "cache (`LLMEngine.reset_encoder_cache`, vLLM >=0.16) and multi-modal caches (`reset_mm_cache`) are "
             "reset, so a reused image is encoded with the new weights; vLLM <0.16 has no reset: one WARNING. "
             "Stands down where `sync_weights` resets the encoder cache The reset is `shim.vllm.caches`; the "
             "shim's own push path (`shim.trl.colocate`) does the same while this patch is on."),
)

ONLINE_DPO = PATCH.like(
    id="trl-online-dpo-encoder-cache",
    module="trl.experimental.online_dpo.online_dpo_trainer",
    affected=">=0.26.0",
    apply=apply_online_dpo,
    probe=_probe("OnlineDPOTrainer", "_move_model_to_vllm"),
    summary="OnlineDPOTrainer._move_model_to_vllm (its own push, colocate): vLLM's encoder and multi-modal caches "
            "reset after it, so reused images are encoded with the new weights (sleep mode off too)",
    changes=("`OnlineDPOTrainer._move_model_to_vllm` (colocate): after its push (a prefix-cache reset only) the "
             "encoder and multi-modal caches are reset, as `trl-vlm-encoder-cache` does for `VLLMGeneration`"),
    verified=("CPU: real TRL 1.16.0 OnlineDPO with sleep mode off (its default), the `VLLMGeneration` record "
              "disabled: a reused image gets the old vision tower's embedding without the shim (asserted), fresh "
              "with it"),
)
ONLINE_DPO_0X = ONLINE_DPO.like(
    id="trl-online-dpo-encoder-cache-0x", module="trl.trainer.online_dpo_trainer", affected=">=0.23.0,<0.26.0",
    tested_at=("trl", "0.25.1"),
    summary="0.23-0.25 OnlineDPOTrainer._move_model_to_vllm: the same reset (from 0.26 the class there subclasses "
            "trl.experimental's)",
    verified="CPU: contract only (TRL 0.25.1, the same push and prefix-only reset as 1.16.0)")

PATCHES = [PATCH, ONLINE_DPO, ONLINE_DPO_0X]
