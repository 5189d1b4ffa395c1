"""ms-swift's PEFT weight push with the LoRA adapter merged out of place (``swift-lora-merge-drift``, ``-3x``).

ms-swift merges the adapter into the base weights in place around every push, and in bf16 the unmerge does not
give the base back: :func:`move_model_to_vllm` makes the merge and unmerge write nothing and hands the engine
each LoRA base tensor merged on a copy (``shim.peft.merge.Push``). Left to upstream, as it is: not a PEFT
model; FSDP2 (ms-swift merges out of place there itself, ``_merge_lora_into_state_dict``); colocate on an NPU
(vllm-ascend's reload runner reads the state dicts without ``_load_state_dict_to_vllm``); a layer the
out-of-place path cannot reproduce.
"""
from __future__ import annotations

from collections.abc import Mapping

from shim.engine.shadow import shadow
from shim.peft import merge

LOAD = "_load_state_dict_to_vllm"


class _Merged(Mapping):
    """A state dict whose LoRA base tensors are read merged (``Push.tensor``), lazily, key by key."""

    def __init__(self, raw, push):
        self._raw, self._push = raw, push

    def __getitem__(self, key):
        return self._push.tensor(self._raw[key])

    def __iter__(self):
        return iter(self._raw)

    def __len__(self):
        return len(self._raw)


def _why_not(trainer) -> "str | None":
    if getattr(trainer, "_is_fsdp2", False):
        return "FSDP2 (ms-swift merges out of place there itself)"
    if getattr(trainer, "vllm_mode", None) == "colocate":
        from transformers.utils import is_torch_npu_available

        if is_torch_npu_available():
            return "colocate on an NPU (vllm-ascend's reload runner reads the weights)"
    return None


def _loading_merged(trainer, push):
    own = getattr(trainer, LOAD)
    return shadow(trainer, LOAD,
                        lambda state_dict, *args, **kwargs: own(_Merged(state_dict, push), *args, **kwargs))


def move_model_to_vllm(patch_id: str):
    """Wrapper of ``RolloutTrainerMixin._move_model_to_vllm`` for the record ``patch_id``.

    Upstream (3.10-4.6 ``RolloutTrainerMixin._move_model_to_vllm``): with ``--tuner_type lora`` and vLLM's
    own LoRA off, ``_move_full_model_to_vllm`` runs per parameter group ``patch_lora_merge`` (each
    LoraLayer's ``merge`` restricted to the group), ``model.merge_adapter()``, collects the group's
    ``param.data`` (3.x: ``model.state_dict()``, tensors sharing the parameters' storage) under vLLM's
    names and hands them to ``_load_state_dict_to_vllm`` (colocate: ``load_weights(state_dict.items())``;
    server: flattened buckets or ``update_named_param``), then ``model.unmerge_adapter()``. With vLLM's
    LoRA on, ``_move_adapter_to_vllm`` merges and unmerges too, around ``get_peft_model_state_dict``,
    which reads the adapter tensors only.

    One push: ``shim.peft.merge.Push`` stands in for the model's merge and unmerge, and
    ``_load_state_dict_to_vllm`` is stood in for on the trainer by the class's own called with a
    read-only view of the state dict whose values pass through ``Push.tensor`` as they are read (a LoRA
    base weight comes out merged by its layer's ``merge`` -- ms-swift's group-restricted one, then
    PEFT's -- applied to a copy, one layer at a time). The adapter push needs no merge at all: the
    stand-in merge writes nothing and the adapter tensors are read as they are.
    """

    def wrapper(wrapped, instance, args, kwargs):
        push = merge.plan(patch_id, getattr(instance, "model", None), why_not=_why_not(instance), whole=False)
        if push is None:
            return wrapped(*args, **kwargs)
        with push.standing_in(), _loading_merged(instance, push):
            return wrapped(*args, **kwargs)

    return wrapper


def verified_tensors(trainer):
    """The verification's source for ``trainer``'s model (``shim.verify.weights.armed``): with vLLM's LoRA off
    ms-swift pushes the adapter merged into the base under the names TRL uses (``_process_state_dict_for_vllm``:
    ``base_model.model.`` and ``.base_layer`` dropped, the adapter tensors skipped), so
    :func:`shim.peft.merge.verified_tensors`; with it on the engine holds the base under ``.base_layer`` names
    and the adapter in its LoRA manager: :func:`shim.peft.adapter.verified_tensors`."""

    def source(model):
        if getattr(trainer, "rollout_enable_lora", False):
            from shim.peft import adapter

            return adapter.verified_tensors(model)
        return merge.verified_tensors(model)

    return source
