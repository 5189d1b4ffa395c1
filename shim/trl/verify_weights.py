"""Weight verification (``SHIM_VERIFY_WEIGHTS``) at TRL's generate sites: which trainer model the engine must
equal (records ``verify-weights-trl`` and its ``-grpo`` / ``-rloo`` / ``-online-dpo`` / ``-gold`` sites; the
why is in ``patches/verify_weights.py``)."""


def arming_wrapper(site: str, predicate, llm_attr: str = "llm"):
    """A wrapper of a trainer's generate method (``site``: ``Class.method``) that arms the trainer's engine
    (``instance.<llm_attr>``) with the trainer model for the duration of the call, where ``predicate(instance)``
    holds (colocate) and ms-swift does not own the engine."""

    def wrapper(wrapped, instance, args, kwargs):
        from shim.peft import merge
        from shim.trl import synced_llm
        from shim.verify import weights as verify

        llm = getattr(instance, llm_attr, None)
        if llm is None or not predicate(instance) or synced_llm.owned_by_swift(instance):
            return wrapped(*args, **kwargs)
        with verify.armed(llm, getattr(instance, "model", None), site, merge.verified_tensors):
            return wrapped(*args, **kwargs)

    return wrapper
