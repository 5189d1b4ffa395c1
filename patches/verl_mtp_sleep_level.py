"""verl sleeps a colocated MTP rollout at level 2: the drafter's weights are lost (0 draft tokens accepted).

Upstream: volcengine/verl#6661 (bug and fix), fixed in 0.9.0 (``_sleep_hybrid``: level 1 when MTP rollout is on)
Affects:  verl >=0.7.1,<0.9.0, HYBRID rollout (colocated, ``free_cache_engine``), vLLM, full weights (no LoRA
          adapter) with ``mtp.enable`` and ``mtp.enable_rollout``
Remove:   when the shim's minimum supported verl is >=0.9.0

``vLLMHttpServer`` sleeps the HYBRID engine at level 2 unless a LoRA adapter (0.8.0: or NPU) asks for 1. Level 2
discards the MTP drafter's weights, which verl's push does not restore (0.7.1 never writes the drafter; 0.8.0
writes only the names the actor has), so the drafter proposes from garbage.
"""
from shim.engine.patch import Patch

ID = "verl-mtp-sleep-level"


def _sleep_method(cls):
    """``("_sleep_hybrid", False)`` (0.8.0), ``("sleep", True)`` (0.7.1: HYBRID branch of ``sleep``), or a
    stand-down reason."""
    from shim.engine import probes

    if cls is None:
        return probes.changed("vLLMHttpServer not in verl.workers.rollout.vllm_rollout.vllm_async_server")
    if "_sleep_hybrid" in vars(cls):
        source, reason = probes.source(cls._sleep_hybrid, "vLLMHttpServer._sleep_hybrid")
        if source is None:
            return reason
        if "mtp" in source:
            return "fixed upstream (_sleep_hybrid reads the MTP config)"
        if "engine.sleep(level=sleep_level)" not in source or "sleep_level = 2" not in source:
            return probes.changed("vLLMHttpServer._sleep_hybrid has no engine.sleep(level=sleep_level) at level 2")
        return ("_sleep_hybrid", False)
    source, reason = probes.source(vars(cls).get("sleep"), "vLLMHttpServer.sleep")
    if source is None:
        return reason
    if "mtp" in source:
        return "fixed upstream (sleep reads the MTP config)"
    if 'collective_rpc("sleep"' not in source or "sleep_level = 2" not in source or "HYBRID" not in source:
        return probes.changed('vLLMHttpServer.sleep has no HYBRID collective_rpc("sleep") at level 2')
    return ("sleep", True)


def probe(module):
    shape = _sleep_method(getattr(module, "vLLMHttpServer", None))
    return shape if isinstance(shape, str) else None


def apply(module, patcher):
    from shim.verl import mtp_sleep_level

    cls = module.vLLMHttpServer
    name, hybrid_only = _sleep_method(cls)
    patcher.wrap(cls, name, mtp_sleep_level.sleep_wrapper(ID, hybrid_only))


PATCH = Patch(
    id=ID,
    tested_at=("verl", "0.8.0"),
    issue="volcengine/verl#6661",
    distribution="verl",
    affected=">=0.7.1,<0.9.0",
    fixed_in="0.9.0",
    module="verl.workers.rollout.vllm_rollout.vllm_async_server",
    apply=apply,
    probe=probe,
    summary="HYBRID rollout with MTP speculative decoding: the sleep runs at level 1 (as verl 0.9.0), so the "
            "drafter's weights survive it; MTP off: level 2 unchanged",
    verified=("CPU: real verl 0.7.1 and 0.8.0 on the stand-in's `AsyncLLM` with an MTP drafter: the drafter's "
              "weights discarded after the first sleep without the shim (asserted), kept with it; 0.9.0 stands "
              "down"),
    changes=("verl's HYBRID rollout sleep (`vLLMHttpServer`, 0.7.1-0.8.x) with an MTP drafter sleeps at level 1, "
             "as 0.9.0 does (level 2 discards the drafter's weights, never pushed again: no draft token accepted); "
             "MTP off stays at level 2. Where verl sleeps: 0.7.1 in `sleep` through `engine.collective_rpc(\"sleep\", "
             "kwargs={\"level\": 2})`, 0.8.0 in `_sleep_hybrid` through `engine.sleep(level=2)` "
             "(`verl.workers.rollout.vllm_rollout.vllm_async_server`); the wrapper (`shim.verl.mtp_sleep_level`) "
             "applies 0.9.0's condition (`config.mtp` enable and enable_rollout); the probe tells the two shapes "
             "apart and stands down where `_sleep_hybrid` already reads the MTP config."),
)

PATCHES = [PATCH]
