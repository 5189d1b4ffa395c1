"""TRL's PEFT weight push with the LoRA adapter merged out of place (patches ``trl-lora-merge-drift*``).

Every TRL push of a PEFT model runs ``model.merge_adapter()``, pushes each base tensor's ``param.data``, then
``model.unmerge_adapter()``; ``shim.peft.merge.Push`` stands in for the merge and unmerge during one push and
merges each LoRA base tensor out of place, one layer at a time, as the push reads it: through
:func:`iter_named_params` (1.11-1.16) or :func:`pushes_merged` (0.23-1.10). Not a PEFT model, FSDP (TRL's
FSDP walk re-gathers module by module, so a storage address noted at the merge is not the one pushed) or a
layer the out-of-place path cannot reproduce: upstream's code, untouched.
"""
from __future__ import annotations

from contextlib import ExitStack

from shim.engine.shadow import shadow
from shim.peft import merge


def _fsdp(obj) -> bool:
    return bool(getattr(getattr(obj, "_dist", None), "is_fsdp", False) or getattr(obj, "is_fsdp_enabled", False))


def _stream(push, pairs):
    try:
        with push.standing_in():
            for name, tensor in pairs:
                yield name, push.tensor(tensor)
    finally:
        pairs.close()


def iter_named_params(wrapped, instance, args, kwargs):
    """Wrapper of ``VLLMGeneration._iter_named_params`` (a generator function: this returns a generator).

    1.11-1.16 ``VLLMGeneration._iter_named_params`` is the one iterator the colocate push
    (``load_weights`` per tensor) and the server-mode stream (metadata pass, then
    ``vllm_client.update_named_params``) read: every yielded tensor passes through ``Push.tensor``.
    """
    push = merge.plan("trl-lora-merge-drift", getattr(instance, "model", None),
                      why_not="FSDP" if _fsdp(instance) else None)
    if push is None:
        return wrapped(*args, **kwargs)
    return _stream(push, wrapped(*args, **kwargs))


def _engine_model(llm):
    """The colocated engine's model, as TRL reaches it (``llm.llm_engine...model_runner.model``)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None


def _destination(obj) -> tuple:
    """``(object, method name, argument transform)`` where this push writes each tensor, or a reason."""
    mode = getattr(obj, "mode", None) or getattr(obj, "vllm_mode", None)
    if mode == "server":
        client = getattr(obj, "vllm_client", None)
        if client is None:  # a rank that pushes nothing (TRL pushes from the main process only)
            return None, None, None
        return client, "update_named_param", lambda push, args: (args[0], push.tensor(args[1]), *args[2:])
    model = _engine_model(getattr(obj, "llm", None)) if mode == "colocate" else None
    if model is None:
        return f"no colocated engine model to push into (mode {mode!r})"
    return model, "load_weights", lambda push, args: ([(n, push.tensor(t)) for n, t in args[0]], *args[1:])


def _through(push, owner, name, transform):
    """``owner.name`` calls what was there with ``transform``ed arguments, for the one push (stacks with
    other stand-ins of the same name, e.g. the shim's reload session; a call by keyword passes as it is:
    the unmerge then warns about the tensors that went without the adapter)."""
    own = getattr(owner, name)

    def through(*args, **kwargs):
        return own(*(transform(push, args) if args and not kwargs else args), **kwargs)

    return shadow(owner, name, through)


def pushes_merged(patch_id: str):
    """Wrapper of a push method that writes each tensor to the engine itself (``VLLMGeneration.sync_weights``
    0.28-1.10, ``GRPOTrainer``/``RLOOTrainer._move_model_to_vllm`` 0.23-0.27).

    0.28-1.10 ``VLLMGeneration.sync_weights`` and the 0.23-0.27 trainers' ``_move_model_to_vllm``
    (GRPO, RLOO) push each tensor straight to the engine: the colocated engine model's
    ``load_weights([(name, tensor)])`` or, in server mode, ``vllm_client.update_named_param(name,
    tensor)`` (1.6+ through ``_push_param_to_vllm``, which calls the same two). Those two are stood in
    for on their objects (instance attributes, for the one push) with calls of their own that get the
    tensors through ``Push.tensor``.
    """

    def wrapper(wrapped, instance, args, kwargs):
        model = getattr(instance, "model", None)
        destination = _destination(instance)
        why_not = "FSDP" if _fsdp(instance) else destination if isinstance(destination, str) else None
        owner, name, transform = (None, None, None) if why_not else destination
        push = merge.plan(patch_id, model, why_not=why_not, whole=owner is not None)
        if push is None:
            return wrapped(*args, **kwargs)
        with ExitStack() as stack:
            stack.enter_context(push.standing_in())
            if owner is not None:
                stack.enter_context(_through(push, owner, name, transform))
            return wrapped(*args, **kwargs)

    return wrapper
