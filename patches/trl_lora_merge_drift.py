"""TRL's LoRA weight push moves the frozen base model by a rounding at every sync.

Upstream: none reported (found here; open in every TRL and PEFT release up to trl 1.16.0 / peft 0.21.2)
Affects:  trl with a PEFT model and vLLM (colocate and server mode), bf16/fp16 base weights: every release
          that pushes through merge_adapter()/unmerge_adapter() (0.x trainers' _move_model_to_vllm,
          VLLMGeneration.sync_weights 0.28-1.10, VLLMGeneration._iter_named_params 1.11-1.16);
          this record covers >=1.11.0 (the _iter_named_params shape)
Remove:   when the shim's minimum supported trl pushes a PEFT model's merged weights without writing its base

Each push calls ``model.merge_adapter()`` (PEFT adds every LoRA delta into its base weight in place),
reads the merged base tensors, and ``model.unmerge_adapter()`` subtracts the deltas again. In bfloat16
``(W + dW) - dW != W``: the frozen base random-walks with every sync, and the trainer's forward and all
later pushes read the moved base. ``shim.trl.lora_merge`` wraps ``VLLMGeneration._iter_named_params``
(the one iterator the colocate push and the server-mode stream both read): for a ``peft.PeftModel`` the
merge and unmerge write nothing and each LoRA base tensor is replaced, as it is yielded, by PEFT's own
merge of its layer applied to a copy (``shim.peft.merge``, shared with ``swift-lora-merge-drift``); the
engine receives what upstream's merge gives it, the base keeps its bytes. Non-PEFT models, FSDP and layers the out-of-place path cannot reproduce exactly run upstream's
code unchanged. Stands down where ``_iter_named_params`` no longer merges in place (no
``merge_adapter``/``unmerge_adapter`` in it).
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed

_NAMES = {"merge_adapter", "unmerge_adapter"}


def probe(module):
    import inspect

    cls = getattr(module, "VLLMGeneration", None)
    fn = inspect.unwrap(getattr(cls, "_iter_named_params", None) or (lambda: None))
    if not inspect.isgeneratorfunction(fn):
        return changed("VLLMGeneration._iter_named_params is not a generator")
    if not _NAMES <= set(fn.__code__.co_names):
        return "upstream merges out of place (_iter_named_params calls no merge_adapter/unmerge_adapter)"
    return None


def apply(module, patcher):
    from shim.trl import lora_merge

    patcher.wrap(module.VLLMGeneration, "_iter_named_params", lora_merge.iter_named_params)


PATCH = Patch(
    id="trl-lora-merge-drift",
    kind="fix",
    tested_at=("trl", "1.16.0"),
    issue="trl LoRA merge drift (in-place merge_adapter/unmerge_adapter)",
    distribution="trl",
    affected=">=1.11.0",
    module="trl.generation.vllm_generation",
    apply=apply,
    probe=probe,
    summary="PEFT LoRA weight push (colocate and server): the adapter merged out of place per tensor, so the "
            "frozen base keeps its bytes; the engine gets what upstream's in-place merge gives it",
    verified="CPU: real TRL 1.16.0 GRPOTrainer with PEFT 0.18.1 LoRA (Linear + Embedding) on a bf16 model, "
             "colocate on the vLLM stand-in and server mode: base bytes unchanged, engine = base + adapter",
)

PATCHES = [PATCH]
