"""Weight verification (``SHIM_VERIFY_WEIGHTS``) of ms-swift's colocate rollouts (records ``verify-weights-swift``
and ``-4x``; the why is in ``patches/verify_weights.py``): ms-swift drives vLLM's ``LLMEngine`` without
``LLM.generate``, so the engine is verified right before ``_infer_single_or_multi_turn``."""


def infer_wrapper(wrapped, instance, args, kwargs):
    from shim.swift import lora_merge
    from shim.verify import weights as verify

    train_args = getattr(instance, "args", None)
    engine = getattr(instance, "engine", None)
    if (engine is not None and getattr(instance, "use_fast_infer", False)
            and getattr(instance, "vllm_mode", None) == "colocate"
            and not getattr(train_args, "async_generate", False)):
        with verify.armed(engine, getattr(instance, "model", None), "RolloutTrainerMixin._fast_infer",
                          lora_merge.verified_tensors(instance)):
            verify.before_generate(engine)
    return wrapped(*args, **kwargs)
