"""The sleep level of TRL's colocated engine, chosen by ``SHIM_SLEEP_LEVEL`` instead of hard-coded.

TRL's ``VLLMGeneration`` (trl 0.28.0 - 1.16.0, read in every release's wheel) calls ``self.llm.sleep(level=2)``
right after building its colocated ``vllm.LLM`` in ``_init_vllm`` and at the end of every ``generate``; no
argument changes the 2. Level 2 discards the weights; level 1 copies them to host memory and brings them back at
the wake, together with every plain tensor the weights tag holds (kernel layouts, MoE maps, MLA's absorbed
matrices: what no weight push rewrites). Users of backends whose level 2 is unreliable (vllm-ascend MoE:
vllm-ascend#13012, #13352, #16725) need 1.
"""
from __future__ import annotations

from shim.engine import call_args, config, log

OWNED = "_shim_sleep_level_owned"
"""Class attribute of :func:`engine_class`'s subclass: an engine whose sleeps follow SHIM_SLEEP_LEVEL."""


def override() -> "int | None":
    """SHIM_SLEEP_LEVEL (1 or 2), else None; a bad value is one WARNING and the trainer's own level
    (``config.read``: inside a sleep nothing may raise)."""
    return config.sleep_level()


def owned(llm) -> bool:
    """``llm`` (or the engine a proxy wraps) was built by TRL's VLLMGeneration through :func:`engine_class`."""
    return bool(getattr(llm, OWNED, False))


def level(llm, requested):
    """The level ``llm`` sleeps at when asked for ``requested``."""
    if not owned(llm) or not isinstance(requested, int) or requested < 1:
        return requested
    chosen = override()
    return requested if chosen is None else chosen


def _with_level(upstream, args, kwargs, value):
    """``(args, kwargs)`` of a ``sleep`` call with its ``level`` argument set to ``value``."""
    if "level" in kwargs or not args:
        return args, {**kwargs, "level": value}
    names = call_args.positional_names(upstream) or ()
    if names[:1] == ("level",):
        return (value, *args[1:]), kwargs
    return args, kwargs


def engine_class(base, patch_id: str):
    """A subclass of ``base`` (vLLM's ``LLM``) whose sleeps run at :func:`level`; carries the
    patch's marker (``shim.engine.patcher.MARKER``) so ``status`` and ``remove`` see it.

    The patch binds it to the name ``LLM`` in ``trl.generation.vllm_generation`` (the only place that
    module uses it is the construction), so the first sleep, right after construction, is covered too,
    and ``isinstance(llm, vllm.LLM)`` still holds. Level 0 (vLLM >= 0.18: pause scheduling only) is left
    as asked. What depends on the level is the shim's sleep state (``shim.vllm.sleep_state.note_sleep``):
    after a level-1 sleep the woken weights are the ones slept with, so no push is needed to make them
    valid; the TRL binding (``shim.trl.synced_llm``) records the level applied. TRL >= 1.10 pushes before
    every generate after any sleep (``_llm_weights_sleeping``); 0.28 - 1.9.2 with the shim push whenever
    the weights were discarded: either way the rollouts use the trainer's weights at both levels.
    """
    from shim.engine.patcher import MARKER

    def sleep(self, *args, **kwargs):
        upstream = super(cls, self).sleep  # vLLM's (and the shim's sleep check around it)
        requested = call_args.arg(upstream, args, kwargs, "level", 1)
        chosen = level(self, requested)
        if chosen != requested:
            if log.once((patch_id, "engine", id(self))):
                log.decision(f"{patch_id}: TRL's colocated engine sleeps at level {chosen} instead of "
                             f"{requested} ({config.SHIM_SLEEP_LEVEL}={chosen})")
            args, kwargs = _with_level(upstream, args, kwargs, chosen)
        return upstream(*args, **kwargs)

    namespace = {"sleep": sleep, OWNED: True, MARKER: patch_id, "__module__": base.__module__,
                 "__doc__": base.__doc__, "__qualname__": base.__qualname__}
    cls = type(base.__name__, (base,), namespace)
    return cls
