"""A proxy for a colocated ``vllm.LLM`` that keeps its weights equal to the trainer's.

Trainers drive sleep mode with their own counters (TRL's ``_last_loaded_step``, ms-swift's ``is_sleeping``
checks) and refill woken weights with ``collective_rpc("reload_weights")``, which reads the checkpoint on disk
-- the *initial* weights. :class:`SyncedLLM` sits where the trainer keeps its ``llm`` and enforces one invariant
instead, from the shared sleep state (``shim.vllm.sleep_state``): before a generate, the engine's weights are the
trainer's (pushed with the trainer's own push function when they are asleep, discarded or reloaded from disk).
Everything else is forwarded untouched (``isinstance(proxy, LLM)`` holds).
"""
from __future__ import annotations

from shim.engine import log
from shim.trl import sleep_level
from shim.vllm import sleep_state, wake_plan

REPLACE = "replace"
FALLBACK = "fallback"


def _proxy_base():
    import wrapt

    return getattr(wrapt, "BaseObjectProxy", None) or wrapt.ObjectProxy


def sync_from_engine(llm) -> sleep_state.SleepState:
    """Reconcile the record with the executor (a sleep issued before the proxy existed)."""
    state = sleep_state.state_for(llm)
    tags = wake_plan.asleep_tags(llm)
    if "weights" in tags and not state.weights_asleep:
        # Asleep at an unknown level: treat the contents as discarded (push is always safe).
        state.weights_valid = False
        state.weights_pushed = False
    state.asleep = tags
    return state


_classes: dict = {}


def synced_class():
    """What the proxy changes:

    - ``generate``/``chat``: if the engine's weights are not the trainer's (asleep, discarded by a
      level-2 sleep, or reloaded from disk), push the trainer's weights first;
    - ``collective_rpc("reload_weights")``: ``reload="replace"`` does not read the disk; the push before
      the next generate puts the trainer's weights there (what TRL 1.10.0 does, PR #5313: one push,
      only when needed); ``reload="fallback"`` reloads, and where the backend has no ``reload_weights``
      (vllm-ascend < 0.24.0rc1 raises NotImplementedError) the push before generate fills the weights;
    - ``wake_up(tags)``: wakes each requested tag that is asleep and skips the awake ones (vLLM's
      executor ignores the whole call, with a warning, if any requested tag is awake), after gc and the
      device's ``empty_cache``;
    - ``sleep(level)``: recorded in the sleep state, at the level the engine really sleeps at
      (``shim.trl.sleep_level``: SHIM_SLEEP_LEVEL on TRL's ``VLLMGeneration`` engine).
    """
    base = _proxy_base()
    if base in _classes:
        return _classes[base]

    class SyncedLLM(base):
        __doc__ = __doc__

        def __init__(self, llm, push, reload: str = REPLACE):
            super().__init__(llm)
            self._self_push = push
            self._self_reload = reload
            sync_from_engine(llm)

        @property
        def shim_state(self) -> sleep_state.SleepState:
            return sleep_state.state_for(self.__wrapped__)

        def _self_ensure_weights(self) -> None:
            state = sync_from_engine(self.__wrapped__)
            if state.needs_push:
                log.debug("weights are not the trainer's before generate: pushing them")
                self._self_push()

        def wake_up(self, tags=None, *args, **kwargs):
            llm = self.__wrapped__
            # Where the sleep check (shim.vllm.sleep_check) named this engine, it releases the cache itself.
            release = not sleep_state.state_for(llm).engine
            result, _, _ = wake_plan.wake(llm, tags, lambda t: llm.wake_up(t, *args, **kwargs), release=release)
            return result

        def sleep(self, level: int = 1, *args, **kwargs):
            llm = self.__wrapped__
            level = sleep_level.level(llm, level)  # SHIM_SLEEP_LEVEL on TRL's VLLMGeneration engine
            result = llm.sleep(level, *args, **kwargs)
            sleep_state.note_sleep(llm, level)
            return result

        def collective_rpc(self, method, *args, **kwargs):
            llm = self.__wrapped__
            if method != "reload_weights":
                return llm.collective_rpc(method, *args, **kwargs)
            if self._self_reload == FALLBACK:
                try:
                    result = llm.collective_rpc(method, *args, **kwargs)
                except NotImplementedError:
                    log.debug("backend has no reload_weights: the trainer's weights are pushed before generating")
                else:
                    sleep_state.note_weights_reloaded(llm)
                    return result
            # REPLACE (or no reload on this backend): the disk holds the initial weights, never read it.
            # The trainer's weights are pushed before the next generate if they are not there already.
            return [None]

        def generate(self, *args, **kwargs):
            self._self_ensure_weights()
            return self.__wrapped__.generate(*args, **kwargs)

        def chat(self, *args, **kwargs):
            self._self_ensure_weights()
            return self.__wrapped__.chat(*args, **kwargs)

    _classes[base] = SyncedLLM
    return SyncedLLM


def attach(llm, push, reload: str = REPLACE):
    """Wrap ``llm`` in :class:`SyncedLLM` once; an ``llm`` already wrapped is returned as it is."""
    if getattr(llm, "_self_push", None) is not None:
        return llm
    return synced_class()(llm, push, reload)


def owned_by_swift(obj) -> bool:
    """ms-swift subclasses TRL's trainers, deletes their ``__init__`` and drives vLLM
    itself: the TRL patches never act on its objects."""
    return any(c.__module__.split(".")[0] == "swift" for c in type(obj).__mro__)


def is_attached(llm) -> bool:
    return getattr(llm, "_self_push", None) is not None


def after_push(llm) -> None:
    """Call after the trainer's push function returned: the weights are the trainer's, and what
    the old weights computed (encoder / multi-modal caches, ``shim.vllm.caches``) is dropped."""
    from shim.vllm import caches

    sleep_state.note_weights_pushed(getattr(llm, "__wrapped__", llm))
    caches.after_push(llm)
    from shim.observe import events

    events.count("weight_pushes")  # shim/weight_pushes in the trainer's metrics
