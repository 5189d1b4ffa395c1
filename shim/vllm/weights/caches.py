"""After a weight push: drop what the old weights computed, and make sure the prefix reset held.

Two upstream gaps, one moment (right after the trainer wrote new weights into a colocated engine):

- Encoder and multi-modal caches (huggingface/trl#7198): vLLM's encoder cache keeps an image's encoder output
  across requests and a weight update does not invalidate it; TRL's ``VLLMGeneration.sync_weights`` resets
  only the prefix cache, so a reused image gets the embedding of the OLD vision tower
  (:func:`reset_encoder_caches`; on ``AsyncLLM``, verl, volcengine/verl#6523: :func:`reset_encoder_caches_async`).
- Prefix-cache reset that fails silently (vllm#28827): ``reset_prefix_cache()`` returns False while requests
  hold KV blocks and TRL / ms-swift ignore it, so prompts after the update reuse KV computed with the old
  weights (:func:`check_prefix_reset`).
"""
from __future__ import annotations

import weakref

from shim.engine import config, log
from shim.vllm import engines

ENCODER_PATCH = "trl-vlm-encoder-cache"
PREFIX_PATCH = "vllm-prefix-reset-check"

_warned: "weakref.WeakSet" = weakref.WeakSet()
_warned_ids: set = set()


def _once(engine) -> bool:
    """True the first time for ``engine`` (one WARNING per engine)."""
    try:
        if engine in _warned:
            return False
        _warned.add(engine)
    except TypeError:
        if id(engine) in _warned_ids:
            return False
        _warned_ids.add(id(engine))
    return True


def patch_active(patch_id: str) -> bool:
    """Whether ``patch_id`` is applied or still waiting for its module (not disabled, removed, failed)."""
    from shim.engine import registry
    from shim.engine.patch import APPLIED, WAITING

    decision = registry.decisions().get(patch_id)
    return decision is not None and decision.decision in (APPLIED, WAITING)


def reset_encoder_caches(llm) -> list:
    """Reset the encoder and multi-modal caches of ``llm`` (a ``vllm.LLM`` or its engine) where
    the engine has them; returns the names of the caches reset. Never raises.

    vLLM's encoder cache (``vllm/v1/core/encoder_cache_manager.py`` + ``GPUModelRunner.encoder_cache``)
    shares an image's encoder output between requests by content hash and keeps it after the request
    ends; a weight update does not invalidate it (huggingface/trl#7198). This calls
    ``LLMEngine.reset_encoder_cache`` (vLLM 0.16+; ``LLM`` has no such method up to 0.31) and
    ``reset_mm_cache`` (``LLM`` 0.12+, ``LLMEngine``). vLLM 0.17+ also resets both inside every sleep of
    level >= 1 (``EngineCore._reset_caches``), so with sleep mode on the gap is the push without a sleep
    before it (sleep mode off, or a push between sleeps); vLLM < 0.16 has no public reset: one WARNING
    says so.
    """
    engine = engines.engine_of(engines.unproxy(llm))
    done = []
    reset_encoder = getattr(engine, "reset_encoder_cache", None)
    if callable(reset_encoder):
        try:
            reset_encoder()
            done.append("encoder")
        except Exception as exc:  # a cache reset must never stop training
            log.warning(f"reset_encoder_cache after a weight push failed ({type(exc).__name__}: {exc})")
    else:
        _no_encoder_reset(engine, "huggingface/trl#7198")
    outer = getattr(llm, "__wrapped__", llm)
    reset_mm = getattr(outer, "reset_mm_cache", None) or getattr(engine, "reset_mm_cache", None)
    if callable(reset_mm):
        try:
            reset_mm()
            done.append("mm")
        except Exception as exc:
            log.warning(f"reset_mm_cache after a weight push failed ({type(exc).__name__}: {exc})")
    if done:
        log.debug(f"after a weight push: reset the {' and '.join(done)} cache(s)")
    return done


def _no_encoder_reset(engine, issue: str) -> None:
    """One WARNING per engine: this vLLM cannot drop the encoder outputs of the old weights."""
    if _once(engine):
        log.warning(f"this vLLM has no reset_encoder_cache (added in 0.16.0): an image reused after a weight "
                    f"update may get the encoder output of the old weights ({issue}); "
                    f"upgrade vLLM to >=0.16 for vision-language training")


async def reset_encoder_caches_async(engine, issue: str) -> list:
    """:func:`reset_encoder_caches` for vLLM's ``AsyncLLM`` (verl's ``vLLMHttpServer.engine``), whose resets
    are coroutines: ``reset_mm_cache`` (every ``AsyncLLM`` verl drives), then ``reset_encoder_cache``
    (``AsyncLLM`` 0.16+, as ``LLMEngine``), the order of verl 0.9.0's ``clear_kv_cache``. Returns the names
    of the caches reset. A reset that raises is one WARNING (``SHIM_STRICT=1``: raised), the other still
    runs; a vLLM without ``reset_encoder_cache``: one WARNING per engine naming ``issue``."""
    done, failed = [], []
    for name, method in (("mm", "reset_mm_cache"), ("encoder", "reset_encoder_cache")):
        reset = getattr(engine, method, None)
        if not callable(reset):
            if name == "encoder":
                _no_encoder_reset(engine, issue)
            continue
        try:
            await reset()
            done.append(name)
        except Exception as exc:  # a cache reset must never stop training (unless SHIM_STRICT)
            failed.append(exc)
            log.warning(f"{method} after a weight update failed ({type(exc).__name__}: {exc}): an image reused "
                        f"after it may get the encoder output of the old weights ({issue})")
    if failed and config.strict():
        raise RuntimeError(f"[shim] a cache reset after a weight update failed ({config.SHIM_STRICT}=1)") \
            from failed[0]
    if done:
        log.debug(f"after a weight update: reset the {' and '.join(done)} cache(s)")
    return done


def after_push(llm) -> None:
    """The shim's own push path (``shim.trl.colocate``): the encoder reset, unless its patch is off."""
    if patch_active(ENCODER_PATCH):
        reset_encoder_caches(llm)


def _accepts(wrapped, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(wrapped).parameters
    except (TypeError, ValueError):
        return False


def check_prefix_reset(wrapped, instance, args, kwargs):
    """Wrapper of ``LLMEngine.reset_prefix_cache``: a False result is retried once, then reported.

    ``reset_prefix_cache()`` returns False while requests hold KV blocks (``BlockPool.reset_prefix_cache``:
    "some blocks are not freed yet", vllm#28827). On False this retries once the KV cache is idle -- at
    once when the engine has no unfinished request, else by preempting the running requests
    (``reset_running_requests=True``, vLLM 0.12+, what vLLM's own sleep does: their KV is recomputed
    with the new weights); still False: one WARNING per engine (``SHIM_STRICT=1`` raises). vLLM <
    0.12's ``LLMEngine.reset_prefix_cache`` returns None (the result is dropped inside vLLM): nothing
    to check there.
    """
    result = wrapped(*args, **kwargs)
    if result is not False:
        return result
    engine = instance
    busy = getattr(engine, "has_unfinished_requests", None)
    try:
        idle = not busy() if callable(busy) else True
    except Exception:
        idle = True
    how = "retried with the engine idle"
    try:
        if idle or not _accepts(wrapped, "reset_running_requests"):
            retry = wrapped(*args, **kwargs)
        else:
            how = "retried with the running requests preempted (reset_running_requests=True)"
            retry = wrapped(reset_running_requests=True)
    except Exception as exc:  # vLLM raises when even preempting cannot free the blocks
        retry = False
        how += f" and raised {type(exc).__name__}: {exc}"
    if retry is not False:
        log.info(f"reset_prefix_cache() returned False (KV blocks in use); {how}: reset")
        return retry
    message = (f"reset_prefix_cache() returned False after a weight update ({how}: still False): "
               f"prompts sharing a prefix with earlier ones reuse KV computed with the old weights "
               f"(vllm#28827). Make sure no request is in flight when the trainer pushes weights")
    if config.strict():
        raise RuntimeError(f"[shim] {message} ({config.SHIM_STRICT}=1)")
    if _once(engine):
        log.warning(message)
    return retry



def resets_after(mode_attribute: str):
    """A wrapper of a TRL push whose object says colocate in ``mode_attribute``: after the push, the
    colocated engine's (``instance.llm``) encoder and multi-modal caches are reset."""

    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        llm = getattr(instance, "llm", None)
        if getattr(instance, mode_attribute, None) == "colocate" and llm is not None:
            reset_encoder_caches(llm)
        return result

    return wrapper


after_sync_weights = resets_after("mode")
"""``VLLMGeneration.sync_weights``."""
after_trainer_push = resets_after("vllm_mode")
"""OnlineDPO's ``_move_model_to_vllm`` (its own push, which resets only the prefix cache). With sleep mode
on, the shim's push path may have reset the caches already (``after_push``): a second reset of an empty
cache costs nothing."""
