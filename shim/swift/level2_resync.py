"""ms-swift 3.2.1-3.11.x: the full weight push after every level-2 sleep (patches ``swift-level2-resync``,
``swift-grpo-level2-resync`` and ``swift-level2-lora-adapter``; the why is in ``patches/swift_level2_resync.py``).
"""


def fast_infer(wrapped, instance, args, kwargs):
    """``_fast_infer``: after a level-2 sleep the push runs (as ms-swift 3.11.1 does)."""
    train_args = getattr(instance, "args", None)
    executor = getattr(getattr(instance, "engine", None), "inner_model_executor", None)
    # 3.2.1-3.4.x have no vllm_mode (colocate is the only mode with a local engine that sleeps)
    if (getattr(instance, "vllm_mode", "colocate") == "colocate" and getattr(train_args, "sleep_level", 0) == 2
            and getattr(executor, "is_sleeping", False)):
        instance._last_loaded_step = None  # never equal to global_step: the push runs
        if hasattr(instance, "base_sync_done"):  # 3.10+: with vllm_enable_lora the base was discarded too
            instance.base_sync_done = False
    return wrapped(*args, **kwargs)


def move_full_model_to_vllm(wrapped, instance, args, kwargs):
    """3.10+: the full push wrote the base weights only (vLLM applies the adapter, ``should_merge_adapter``
    False); after a level-2 sleep the adapter vLLM holds is gone too: push the trainer's adapter."""
    result = wrapped(*args, **kwargs)
    train_args = getattr(instance, "args", None)
    if (getattr(instance, "vllm_mode", "colocate") == "colocate" and getattr(train_args, "sleep_level", 0) == 2
            and getattr(train_args, "train_type", None) == "lora" and getattr(instance, "rollout_enable_lora", False)
            and not getattr(instance, "should_merge_adapter", True)):
        instance._move_adapter_to_vllm()
    return result
