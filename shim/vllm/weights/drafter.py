"""Speculative decoding with sleep mode: the drafter's weights kept across a level-2 sleep (vllm#52479).

vLLM loads the drafter (EAGLE / EAGLE3 / MTP / draft model) into the same ``weights`` pool as the target, and a
level-2 sleep discards it with the target's weights; a trainer's push (``load_weights`` of the policy's
parameters, ms-swift 4.6.0 with ``vllm_speculative_config``) never writes the drafter, so after the first sleep
it proposes from undefined memory: outputs stay right (the target verifies every draft token) but no draft is
accepted. vLLM 0.33 adds ``sleep_preserve_parameter_names`` (``ModelConfig``, an ``EngineArgs`` field and
``--sleep-preserve-parameter-names``): fnmatch patterns over the target's parameter names and the drafter's
own ones prefixed ``draft.`` (``Worker._get_sleep_parameters``, 0.33 and 0.34; parameters the drafter shares
with the target, MTP's embeddings and head, are left out of ``draft.*``). 0.33 copies the matches to the host
at the level-2 sleep and restores them at the weights wake (``_save_sleep_parameters`` /
``_restore_sleep_parameters``); 0.34 leaves their allocations offloaded instead of discarded
(``_discardable_parameters``) and warns once when the drafter's are discarded. In both, ``"draft.*"`` is the one
pattern that may match nothing without a ValueError (no drafter, or an n-gram method), and nothing is done
at level 1.

:func:`keep_drafter` wraps the construction of the engine's arguments (``EngineArgs.__init__`` and
``AsyncEngineArgs.__init__``: dataclasses, each with its own generated ``__init__``). ``LLM(...)`` builds an
``EngineArgs``; ``AsyncLLM`` / ``AsyncLLMEngine.from_engine_args`` take the ``AsyncEngineArgs`` (or
``EngineArgs``) the caller built (ms-swift's ``VllmEngine``, verl, OpenRLHF). The call is bound by name: where
it does not name ``sleep_preserve_parameter_names`` and the built arguments ask for sleep mode and a speculative
config (``speculative_config``, or 0.33's ``spec_method`` / ``spec_model`` aliases), the field becomes
``["draft.*"]``, with one INFO line. A value the caller passed, an explicit ``[]`` included (a trainer that
pushes its drafter and wants no host copy), is left alone. ``EngineArgs.from_cli_args`` passes every field
(``vllm serve``): left alone too; there, ``--sleep-preserve-parameter-names 'draft.*'`` as vLLM 0.34's warning
says. A speculative config that only a speculators-format checkpoint brings (read in ``create_engine_config``)
is not seen here.

A trainer that does push its drafter loses nothing: the preserved copy comes back at the weights wake, the
push writes over it after that wake (0.33's restore runs inside ``Worker.wake_up``; 0.34 maps the offloaded
allocation back there). The cost is host memory the size of the drafter's own parameters at each level-2
sleep, and a copy each way.
"""
from __future__ import annotations

from shim.engine import call_args, log

NAME = "sleep_preserve_parameter_names"
PATTERN = "draft.*"


def _speculative(args) -> bool:
    """The engine arguments ask for speculative decoding."""
    return bool(getattr(args, "speculative_config", None) or getattr(args, "spec_method", None)
                or getattr(args, "spec_model", None))


def _named(wrapped, args, kwargs) -> bool:
    """The call names the field (by keyword or position). A call that does not bind is vLLM's to refuse: said
    named, so nothing is changed."""
    if NAME in kwargs:
        return True
    try:
        return NAME in call_args.signature(wrapped).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return True


def preserve_drafter(engine_args, patch_id: str) -> bool:
    """Set ``["draft.*"]`` on built engine arguments that ask for sleep mode and speculative decoding and
    preserve nothing; True when set."""
    if not getattr(engine_args, "enable_sleep_mode", False) or not _speculative(engine_args):
        return False
    if getattr(engine_args, NAME, None):  # a default of upstream's own: not ours to replace
        return False
    setattr(engine_args, NAME, [PATTERN])
    text = (f"{patch_id}: speculative decoding with sleep mode: {NAME}=['{PATTERN}'] (a level-2 sleep keeps the "
            "drafter's weights; vLLM discards them, vllm#52479, and a push of the policy does not write them)")
    if log.once(("drafter", patch_id)):
        log.decision(text)
    else:
        log.debug(text)
    return True


def keep_drafter(patch_id: str):
    """The wrapt wrapper of ``EngineArgs.__init__`` / ``AsyncEngineArgs.__init__``."""

    def wrapper(wrapped, instance, args, kwargs):
        named = _named(wrapped, args, kwargs)
        result = wrapped(*args, **kwargs)
        if not named and instance is not None:
            try:
                preserve_drafter(instance, patch_id)
            except Exception as exc:  # never break the engine's construction
                log.warning(f"{patch_id}: could not set {NAME} ({type(exc).__name__}: {exc}); the drafter's "
                            "weights are discarded at a level-2 sleep")
        return result

    return wrapper
