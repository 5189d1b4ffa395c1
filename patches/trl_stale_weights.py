"""TRL rollouts use the initial checkpoint under vLLM sleep mode.

Upstream: huggingface/trl#5312 (bug), fixed by #5313 in 1.10.0; #5142 (push into unmapped memory, 0.28.x)
Affects:  trl >=0.28.0,<1.10.0 with vllm_mode="colocate", vllm_enable_sleep_mode=True
Remove:   when the shim's minimum supported trl is >=1.10.0

``VLLMGeneration.generate`` wakes the weights and calls
``collective_rpc("reload_weights")`` after the trainer's ``sync_weights``
pushed the trained weights, so every rollout samples from the checkpoint on
disk. The shim holds the colocated ``llm`` behind ``shim.guarded_llm``: the
reload never reads the disk, the trainer's weights are pushed before a
generate whenever the engine's weights are asleep or were discarded by the
level-2 sleep (the semantics of the upstream ``_llm_weights_sleeping`` flag),
``sync_weights`` wakes the weights before writing them (0.28.x lacks that
wake), and on backends without ``reload_weights`` nothing raises.
"""
from shim.patching import Patch


def _colocate_sleep(gen) -> bool:
    from shim import guarded_llm

    return (getattr(gen, "mode", None) == "colocate" and bool(getattr(gen, "enable_sleep_mode", False))
            and getattr(gen, "llm", None) is not None and not guarded_llm.owned_by_swift(gen))


def _guard(gen) -> None:
    from shim import guarded_llm

    gen.llm = guarded_llm.guard(gen.llm, push=gen.sync_weights)


def _sync_weights(wrapped, instance, args, kwargs):
    from shim import guarded_llm

    if not _colocate_sleep(instance):
        return wrapped(*args, **kwargs)
    _guard(instance)
    instance.llm.wake_up(tags=["weights"])  # never write into unmapped memory (#5142)
    result = wrapped(*args, **kwargs)
    guarded_llm.after_push(instance.llm)
    return result


def _generate(wrapped, instance, args, kwargs):
    if _colocate_sleep(instance):
        _guard(instance)
    return wrapped(*args, **kwargs)


def probe(module):
    import inspect

    cls = getattr(module, "VLLMGeneration", None)
    if cls is None or not all(hasattr(cls, m) for m in ("_init_vllm", "sync_weights", "generate")):
        return "upstream shape changed: VLLMGeneration._init_vllm/sync_weights/generate not found"
    if "_llm_weights_sleeping" in inspect.getsource(cls):
        return "fixed upstream (VLLMGeneration has _llm_weights_sleeping)"
    return None


def apply(module, patcher):
    patcher.wrap(module.VLLMGeneration, "sync_weights", _sync_weights)
    patcher.wrap(module.VLLMGeneration, "generate", _generate)


PATCH = Patch(
    id="trl-stale-weights",
    issue="huggingface/trl#5312",
    distribution="trl",
    affected=">=0.28.0,<1.10.0",
    fixed_in="1.10.0",
    module="trl.generation.vllm_generation",
    apply=apply,
    probe=probe,
    summary="colocate+sleep: push trained weights before generate instead of reload_weights from disk; "
            "wake weights before sync_weights writes them",
    verified="CPU: real TRL 0.28.0-1.9.2 VLLMGeneration + GRPOTrainer on the vLLM stand-in",
)
