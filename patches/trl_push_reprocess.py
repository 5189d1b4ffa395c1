"""TRL's colocated weight push skips vLLM's post-processing: derived and repacked weights stay stale.

Upstream: vllm-project/vllm#42821 (raw model.load_weights runs no process_weights_after_loading; fix PR
          #42823 open), NovaSky-AI/SkyRL#1680 (one layerwise reload per push, not per chunk), RFC
          vllm-project/vllm#48312; TRL pushes with the raw call in every release (1.16.0 read)
Affects:  trl colocate pushes into a vLLM model whose post-processing copies or repacks (MLA W_UK_T/W_UV
          of a quantized kv_b_proj, quantized linears, FlashInfer MoE layouts): VLLMGeneration.sync_weights
          trl >=0.28.0; OnlineDPOTrainer._move_model_to_vllm trl >=0.26.0 (trl.experimental) and
          >=0.23.0,<0.26.0 (trl.trainer); GRPO/RLOO _move_model_to_vllm trl >=0.23.0,<0.28.0
Remove:   when TRL pushes through vLLM's reload (reload_weights(weights_iterator=...) or a weight-update
          session) or vLLM's model.load_weights re-processes by itself (PR #42823)

vLLM's ``process_weights_after_loading`` runs after the initial load (and inside
``reload_weights``), never after ``model.load_weights``: after a push, MLA decode still
multiplies by the initial checkpoint's ``W_UK_T`` / ``W_UV`` (after a level-2 sleep, by the
undefined contents of the re-mapped pages), while prefill uses the new ``kv_b_proj``. Bound
through ``shim.trl.push_reload``: each push method runs inside one ``shim.vllm.weights.reload.session``
-- vLLM's layerwise reload opened at the push's first tensor and finalized after its last (vLLM
0.16+), else the touched attention layers re-processed -- with what it re-derives copied back
into the storage it had (the sleep pool, the CUDA graphs' addresses). The probe reads the class
and stands down where it no longer pushes with a raw ``load_weights`` or already uses the reload.
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
    verified="CPU: real TRL 1.16.0 and 1.9.2 GRPOTrainer on the vLLM stand-in 0.24.0 (DeepSeek-V2 MLA, quantized "
             "kv_b_proj)",
    **_push("VLLMGeneration", "sync_weights", generation_colocate),
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
