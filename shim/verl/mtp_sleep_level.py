"""verl's HYBRID sleep with MTP speculative decoding on: level 1, as verl 0.9.0 does (verl#6661).

verl 0.7.1 and 0.8.0 sleep a HYBRID (colocated) full-weight rollout at level 2 whatever ``config.mtp`` says
(level 1 only for a LoRA adapter; 0.8.0: or NPU). Level 2 discards the MTP drafter's weights (vLLM loads the
drafter into the same ``weights`` tag) and the weight push does not bring them all back (0.7.1 never writes the
drafter, 0.8.0 writes only the names the actor has), so after the first sleep the drafter proposes from garbage
and no draft token is accepted. Level 1 costs host memory (the weights' size per engine) and a copy back at
each wake; verl's wake and push are unchanged (0.9.0 pushes the trainer's weights after a level-1 wake the
same way).
"""
from __future__ import annotations

from shim.engine import call_args, log
from shim.engine.shadow import shadow


def mtp_rollout_enabled(server) -> bool:
    """verl 0.9.0's condition, on the server's rollout config.

    Read in the wheels (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``): 0.7.1's
    ``vLLMHttpServer.sleep`` runs ``engine.collective_rpc("sleep", kwargs={"level": sleep_level})``,
    0.8.0's ``vLLMHttpServer._sleep_hybrid`` runs ``engine.sleep(level=sleep_level)``. verl 0.9.0's
    ``_sleep_hybrid``::

        mtp_config = getattr(self.config, "mtp", None)
        mtp_rollout_enabled = (mtp_config is not None and getattr(mtp_config, "enable", False)
                               and getattr(mtp_config, "enable_rollout", False))
        if mtp_rollout_enabled or self.lora_as_adapter or is_torch_npu_available(check_device=False):
            sleep_level = 1
    """
    mtp_config = getattr(getattr(server, "config", None), "mtp", None)
    return bool(mtp_config is not None and getattr(mtp_config, "enable", False)
                and getattr(mtp_config, "enable_rollout", False))


def _proxy_base():
    import wrapt

    return getattr(wrapt, "BaseObjectProxy", None) or wrapt.ObjectProxy


def level_one_engine(engine, patch_id: str):
    """``engine`` (vLLM's ``AsyncLLM``) with its level-2 sleeps run at level 1; ``isinstance`` holds."""

    class LevelOneEngine(_proxy_base()):
        def sleep(self, *args, **kwargs):
            upstream = self.__wrapped__.sleep
            if call_args.arg(upstream, args, kwargs, "level", 1) == 2:
                args, kwargs = _level_one(upstream, args, kwargs, patch_id)
            return upstream(*args, **kwargs)

        def collective_rpc(self, method, *args, **kwargs):
            # vLLM's AsyncLLM.collective_rpc(method, timeout=None, args=(), kwargs=None), every version
            rpc = kwargs.get("kwargs") if "kwargs" in kwargs else (args[2] if len(args) >= 3 else None)
            if method == "sleep" and isinstance(rpc, dict) and rpc.get("level") == 2:
                _note(patch_id)
                rpc = {**rpc, "level": 1}
                if "kwargs" in kwargs:
                    kwargs = {**kwargs, "kwargs": rpc}
                else:
                    args = (*args[:2], rpc, *args[3:])
            return self.__wrapped__.collective_rpc(method, *args, **kwargs)

    return LevelOneEngine(engine)


def _note(patch_id: str) -> None:
    if log.once((patch_id, "level 1")):
        log.decision(f"{patch_id}: verl's HYBRID rollout with MTP sleeps at level 1 instead of 2 "
                     "(the drafter's weights are kept, as verl 0.9.0 does)")
    else:
        log.debug(f"{patch_id}: level-2 sleep of an MTP rollout run at level 1")


def _level_one(upstream, args, kwargs, patch_id):
    _note(patch_id)
    names = call_args.positional_names(upstream) or ()
    if "level" in kwargs or not args or names[:1] != ("level",):
        return args, {**kwargs, "level": 1}
    return (1, *args[1:]), kwargs


def sleep_wrapper(patch_id: str, hybrid_only: bool):
    """The wrapt wrapper of verl's coroutine method that issues the HYBRID sleep. ``hybrid_only``: the
    method also serves other rollout modes (0.7.1's ``sleep``), act only in HYBRID mode.

    It wraps the method that issues the HYBRID sleep (0.8.0: ``_sleep_hybrid``; 0.7.1: ``sleep``, in
    HYBRID mode only): when MTP rollout is on, for that one call the server's ``engine`` is a proxy
    (:func:`level_one_engine`, ``shim.engine.shadow``) whose ``sleep(level=2)`` and
    ``collective_rpc("sleep", kwargs={"level": 2})`` run at level 1; the rest of verl's method (0.8.0's
    ``reset_encoder_cache`` after the sleep) is upstream's, on the real engine. Levels other than 2 and
    every other call pass through. MTP off: nothing changes (level 2 stays).
    """

    def wrapper(wrapped, instance, args, kwargs):
        try:
            act = instance is not None and mtp_rollout_enabled(instance)
            if act and hybrid_only:
                act = getattr(getattr(instance, "rollout_mode", None), "name", None) == "HYBRID"
            engine = getattr(instance, "engine", None) if act else None
        except Exception as exc:  # never break verl's sleep
            log.warning(f"{patch_id}: could not read the rollout config ({exc}); verl's own level is used")
            engine = None
        if engine is None:
            return wrapped(*args, **kwargs)

        async def run():
            try:
                block = shadow(instance, "engine", level_one_engine(engine, patch_id))
                block.__enter__()
            except Exception as exc:  # an instance that refuses the attribute: upstream's way
                log.warning(f"{patch_id}: could not take over the engine's sleep ({exc}); verl's own level is used")
                return await wrapped(*args, **kwargs)
            try:
                return await wrapped(*args, **kwargs)
            finally:
                block.__exit__(None, None, None)

        return run()

    return wrapper
