"""``vllm.LLM.generate`` / ``chat``: an engine a trainer armed is verified right before vLLM samples (record
``verify-weights-vllm``; the why is in ``patches/verify_weights.py``)."""


def generate_wrapper(wrapped, instance, args, kwargs):
    from shim.verify import weights as verify

    verify.before_generate(instance)
    return wrapped(*args, **kwargs)
