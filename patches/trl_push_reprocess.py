"""TRL's colocated weight push skips vLLM's post-processing: derived and repacked weights stay stale.

Upstream: vllm-project/vllm#42821 (raw load_weights runs no process_weights_after_loading; fix PR #42823 open),
          SkyRL#1680, RFC vllm#48312; TRL pushes with the raw call in every release (1.16.0 read)
Affects:  trl colocate pushes into a vLLM model whose post-processing copies or repacks (MLA W_UK_T/W_UV
          of a quantized kv_b_proj, quantized linears, FlashInfer MoE layouts): trl >=0.28.0 (VLLMGeneration),
          >=0.26.0 and >=0.23.0,<0.26.0 (OnlineDPO), >=0.23.0,<0.28.0 (GRPO/RLOO)
Remove:   when TRL pushes through vLLM's reload (weights_iterator, weight-update session) or PR #42823 lands

vLLM runs ``process_weights_after_loading`` after the initial load and in ``reload_weights``, never after
``model.load_weights``: after a push MLA decode multiplies by stale ``W_UK_T`` / ``W_UV`` (undefined after a
level-2 sleep) while prefill uses the new ``kv_b_proj``.
"""
from shim.engine.patch import Patch
from shim.trl.colocate import generation_colocate, trainer_colocate
from shim.trl.push_reload import binding

ISSUE = "vllm-project/vllm#42821"
SUMMARY = ("{what}: the colocated push runs inside one vLLM layerwise reload (0.16+; else the touched attention "
           "layers re-processed): MLA W_UK_T/W_UV and other post-processed weights follow the pushed weights, "
           "re-derived tensors kept in the sleep pool")


def _push(class_name, push_name, predicate):
    """The fields that name the push method: its binding and summary."""
    probe, apply = binding(class_name, push_name, predicate)
    return dict(probe=probe, apply=apply, summary=SUMMARY.format(what=f"{class_name}.{push_name}"))


GENERATION = Patch(
    id="trl-push-reprocess",
    issue=ISSUE,
    distribution="trl",
    affected=">=0.28.0",
    module="trl.generation.vllm_generation",
    tested_at=("trl", "1.16.0"),
    **_push("VLLMGeneration", "sync_weights", generation_colocate),
    verified=("CPU: real TRL 1.16.0 (shim off), 1.9.2 and 0.26.2 (shim on, this patch disabled) GRPO on a tiny "
              "DeepSeek-V2 with a quantized `kv_b_proj` (stand-in 0.24.0; 0.10.2 for 0.26.2): derived matrices "
              "stale from the first rollout and final greedy output unlike a fresh engine loaded with the "
              "trainer's weights (asserted); with the patch every rollout's matrices follow `kv_b_proj`, stay in "
              "the weights pool, and the greedy output equals the fresh engine's. GPU: `bench/gpu_mla_push.py` "
              "(not run yet)"),
    changes=("TRL's colocated push method (`VLLMGeneration.sync_weights`, `OnlineDPOTrainer._move_model_to_vllm`, "
             "the 0.x GRPO/RLOO `_move_model_to_vllm`) runs inside one `shim.vllm.weights.reload.session`: the engine "
             "model's `load_weights` is wrapped for the push; its first call opens vLLM's "
             "`initialize_layerwise_reload` (after TRL's weights wake, so vLLM's level-2 buffer restore finds the "
             "real buffers), the push's last tensor is followed by `finalize_layerwise_reload` (vLLM 0.16+; before "
             "0.16: the attention layers whose `kv_b_proj` was written re-run `process_weights_after_loading`), "
             "every re-derived plain attribute (MLA `W_UK_T`/`W_UV`) is copied into the storage it had (sleep "
             "pool, CUDA-graph addresses) (the encoder/mm cache reset that 0.24's `reload_weights` adds stays "
             "`trl-vlm-encoder-cache`'s). Colocate only; ms-swift's subclasses untouched. Stands down where the "
             "class no longer pushes with a raw `load_weights` or already uses the reload. Bound through "
             "`shim.trl.push_reload`. Sites: `VLLMGeneration.sync_weights` trl >=0.28.0; "
             "`OnlineDPOTrainer._move_model_to_vllm` trl >=0.26.0 (trl.experimental) and >=0.23.0,<0.26.0 "
             "(trl.trainer); GRPO/RLOO `_move_model_to_vllm` trl >=0.23.0,<0.28.0. One layerwise reload per push, "
             "not per chunk, as NovaSky-AI/SkyRL#1680 does."),
)
ONLINE_DPO = GENERATION.like(
    id="trl-online-dpo-push-reprocess", module="trl.experimental.online_dpo.online_dpo_trainer", affected=">=0.26.0",
    verified="CPU: real TRL 1.16.0 OnlineDPOTrainer on the vLLM stand-in 0.24.0",
    **_push("OnlineDPOTrainer", "_move_model_to_vllm", trainer_colocate))
ONLINE_DPO_0X = ONLINE_DPO.like(
    id="trl-online-dpo-push-reprocess-0x", module="trl.trainer.online_dpo_trainer", affected=">=0.23.0,<0.26.0",
    tested_at=("trl", "0.25.1"),
    verified="CPU: contract only (TRL 0.25.1; from 0.26 the class there subclasses trl.experimental's)")
GRPO = GENERATION.like(
    id="trl-grpo-push-reprocess", module="trl.trainer.grpo_trainer", affected=">=0.23.0,<0.28.0",
    tested_at=("trl", "0.27.2"),
    verified="CPU: real TRL 0.27.2 (stand-in 0.24.0, layerwise reload) and 0.26.2 (stand-in 0.10.2, the touched "
             "attention layers re-processed) GRPOTrainer",
    **_push("GRPOTrainer", "_move_model_to_vllm", trainer_colocate))
RLOO = GRPO.like(id="trl-rloo-push-reprocess", module="trl.trainer.rloo_trainer",
                 verified="CPU: contract only (TRL 0.27.2)", **_push("RLOOTrainer", "_move_model_to_vllm", trainer_colocate))

PATCHES = [GENERATION, ONLINE_DPO, ONLINE_DPO_0X, GRPO, RLOO]
