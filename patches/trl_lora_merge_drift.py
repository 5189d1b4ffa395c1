"""TRL's LoRA weight push moves the frozen base model by a rounding at every sync.

Upstream: none reported (found here; open in every TRL and PEFT release up to trl 1.16.0 / peft 0.21.2)
Affects:  trl >=0.23.0 with a PEFT model and vLLM (colocate and server mode), bf16/fp16 base weights; one
          record per push shape: >=1.11.0, >=0.28.0,<1.11.0, >=0.23.0,<0.28.0 (GRPO and RLOO)
Remove:   when the shim's minimum supported trl pushes a PEFT model's merged weights without writing its base

Each push calls ``model.merge_adapter()`` (PEFT adds every LoRA delta into its base weight in place), reads
the merged base tensors, and ``model.unmerge_adapter()`` subtracts the deltas again. In bfloat16
``(W + dW) - dW != W``: the frozen base random-walks with every sync, and the trainer's forward and all
later pushes read the moved base.
"""
import inspect

from shim.engine.patch import Patch
from shim.engine.probes import changed, missing, source

_ISSUE = "trl LoRA merge drift"
_MERGES = (".merge_adapter()", ".unmerge_adapter()")
_OUT_OF_PLACE = "upstream merges out of place ({} calls no merge_adapter/unmerge_adapter)"


def probe_iter(module):
    cls = getattr(module, "VLLMGeneration", None)
    fn = inspect.unwrap(getattr(cls, "_iter_named_params", None) or (lambda: None))
    if not inspect.isgeneratorfunction(fn):
        return changed("VLLMGeneration._iter_named_params is not a generator")
    if not {"merge_adapter", "unmerge_adapter"} <= set(fn.__code__.co_names):
        return _OUT_OF_PLACE.format("_iter_named_params")
    return None


def apply_iter(module, patcher):
    from shim.trl import lora_merge

    patcher.wrap(module.VLLMGeneration, "_iter_named_params", lora_merge.iter_named_params)


def _pushes_itself(class_name, method):
    """``probe`` and ``apply`` of a push method that merges, then writes each tensor to the engine itself."""
    label = f"{class_name}.{method}"

    def probe(module):
        cls = getattr(module, class_name, None)
        reason = missing(cls, (method,), class_name)
        if reason:
            return reason
        if getattr(cls, "_iter_named_params", None) is not None:
            return "the push reads VLLMGeneration._iter_named_params (trl-lora-merge-drift)"
        text, reason = source(cls, class_name)
        if reason:
            return reason
        push, _ = source(getattr(cls, method), label)
        if not all(m in (push or "") for m in _MERGES):
            return _OUT_OF_PLACE.format(label)
        if ".load_weights([(" not in text or ".update_named_param(" not in text:
            return changed(f"{class_name} pushes through neither load_weights nor update_named_param")
        return None

    def apply(module, patcher):
        from shim.trl import lora_merge

        patcher.wrap(getattr(module, class_name), method, lora_merge.pushes_merged(patcher.patch_id))

    return dict(probe=probe, apply=apply)


_SUMMARY = ("PEFT LoRA weight push (colocate and server): the adapter merged out of place per tensor, so the "
            "frozen base keeps its bytes; the engine gets what upstream's in-place merge gives it")


PATCH = Patch(
    id="trl-lora-merge-drift",
    kind="fix",
    tested_at=("trl", "1.16.0"),
    issue=_ISSUE,
    distribution="trl",
    affected=">=1.11.0",
    module="trl.generation.vllm_generation",
    apply=apply_iter,
    probe=probe_iter,
    summary=_SUMMARY,
    verified=("CPU: real TRL 1.16.0, 1.9.2, 1.0.0 `GRPOTrainer` and 0.27.2 `GRPOTrainer`/`RLOOTrainer` + PEFT "
              "0.18.1 LoRA (`q_proj`, `v_proj`, `embed_tokens`, adapter initialised non-zero) on a bf16 model, 4 "
              "steps, colocate with sleep mode on the stand-in: without the shim the frozen base's bytes change at "
              "the first push (~12k elements) and keep walking (asserted), with it unchanged at all 8 generates "
              "and the engine within one bf16 rounding of base + adapter merged out of place (test-side "
              "reference), both layer classes; server mode on 1.16.0, 1.9.2 and 0.27.2 (TRL's own push with a "
              "recording server stand-in, 4 syncs): the same; DoRA on 1.16.0: upstream unchanged, one WARNING. "
              "0.23.1 + PEFT fails in TRL's own backward on this stack (DDP marks a LoRA weight ready twice, with "
              "and without the shim): not run"),
    changes=("A PEFT model's weight push (colocate and server mode): PEFT's `merge_adapter`/`unmerge_adapter` (in "
             "place: `W += dW`, then `W -= dW`, which in bf16 does not give `W` back) are stood in for during the "
             "push and write nothing; each LoRA base tensor is handed to the engine, as the push reads it, as "
             "PEFT's own `merge` of its layer applied to a copy (one layer's copy alive at a time; "
             "`shim.peft.merge`), so the engine gets the bytes upstream's merge gives it and the frozen base keeps "
             "its bytes. Where the tensors are read: 1.11-1.16 every tensor `VLLMGeneration._iter_named_params` "
             "yields; 0.28-1.10 (`VLLMGeneration.sync_weights`) and 0.23-0.27 "
             "(`GRPOTrainer`/`RLOOTrainer._move_model_to_vllm`) what the push hands the colocated engine model's "
             "`load_weights` or the client's `update_named_param` (stood in for on those objects for the one "
             "push). Left to upstream, one WARNING: FSDP, tuner layers other than LoRA "
             "`Linear`/`Embedding`/`Conv1d-3d`, LoRA variants (DoRA, ...), a layer already merged or offloaded. "
             "Non-PEFT models: upstream untouched. Each stands down by probe where its push no longer calls "
             "`merge_adapter`/`unmerge_adapter`. Bound through `shim.trl.lora_merge` (PEFT's merge on a copy: "
             "`shim.peft.merge`, shared with `swift-lora-merge-drift`); at 1.11+ `_iter_named_params` is the "
             "iterator both the colocate push and the server-mode stream read. Sites: `trl-lora-merge-drift` "
             ">=1.11.0 (`VLLMGeneration._iter_named_params`), `trl-lora-merge-drift-sync` >=0.28.0,<1.11.0 "
             "(`VLLMGeneration.sync_weights`), `trl-lora-merge-drift-grpo` / `-rloo` >=0.23.0,<0.28.0 "
             "(`GRPOTrainer` / `RLOOTrainer._move_model_to_vllm`)."),
)
SYNC = PATCH.like(
    id="trl-lora-merge-drift-sync", affected=">=0.28.0,<1.11.0", tested_at=("trl", "1.9.2"),
    **_pushes_itself("VLLMGeneration", "sync_weights"),
    verified="CPU: real TRL 1.9.2 and 1.0.0 GRPOTrainer with a PEFT LoRA on a bf16 model (colocate; 1.9.2 server "
             "mode too): base bytes unchanged, engine = base + adapter")
GRPO = PATCH.like(
    id="trl-lora-merge-drift-grpo", affected=">=0.23.0,<0.28.0", module="trl.trainer.grpo_trainer",
    tested_at=("trl", "0.27.2"), **_pushes_itself("GRPOTrainer", "_move_model_to_vllm"),
    verified="CPU: real TRL 0.27.2 and 0.23.1 GRPOTrainer with a PEFT LoRA on a bf16 model on the vLLM stand-in: "
             "base bytes unchanged, engine = base + adapter")
RLOO = GRPO.like(
    id="trl-lora-merge-drift-rloo", module="trl.trainer.rloo_trainer", **_pushes_itself("RLOOTrainer", "_move_model_to_vllm"),
    verified="CPU: real TRL 0.27.2 RLOOTrainer with a PEFT LoRA on a bf16 model on the vLLM stand-in: base bytes "
             "unchanged, engine = base + adapter")

PATCHES = [PATCH, SYNC, GRPO, RLOO]
