"""TRL's PEFT weight push with the LoRA adapter merged out of place (patch ``trl-lora-merge-drift``).

TRL 1.11-1.16 ``VLLMGeneration._iter_named_params`` is the one iterator the colocate push
(``load_weights`` per tensor) and the server-mode stream (metadata pass, then
``vllm_client.update_named_params``) read: gather, ``model.merge_adapter()``, yield
``(name, param.data)`` for every base tensor, ``model.unmerge_adapter()``. :func:`iter_named_params`
wraps one call: while upstream's generator runs, ``shim.peft.merge.Push`` stands in for the merge
and unmerge, and every yielded tensor goes through ``Push.tensor`` (a LoRA base weight comes out
merged, out of place, one layer at a time as the iterator is read). Not a PEFT model, FSDP (TRL's
FSDP walk re-gathers module by module, so a storage address noted at the merge is not the one
yielded) or a layer the out-of-place path cannot reproduce: upstream's generator, untouched.
"""
from __future__ import annotations

from shim.peft import merge

PATCH_ID = "trl-lora-merge-drift"


def _stream(push, pairs):
    try:
        with push.standing_in():
            for name, tensor in pairs:
                yield name, push.tensor(tensor)
    finally:
        pairs.close()


def iter_named_params(wrapped, instance, args, kwargs):
    """Wrapper of ``VLLMGeneration._iter_named_params`` (a generator function: this returns a generator)."""
    fsdp = getattr(getattr(instance, "_dist", None), "is_fsdp", False)
    push = merge.plan(PATCH_ID, getattr(instance, "model", None), why_not="FSDP" if fsdp else None)
    if push is None:
        return wrapped(*args, **kwargs)
    return _stream(push, wrapped(*args, **kwargs))
