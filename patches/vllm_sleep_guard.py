"""vLLM sleeps that free nothing: allocator guard, verified sleeps, per-tag wake, telemetry.

Upstream: modelscope/ms-swift#6636 (first sleep frees 0.00 GiB on Ascend); pytorch/pytorch#147851 (expandable
          segments bypass a pluggable allocator's MemPool); vLLM reads only PYTORCH_CUDA_ALLOC_CONF up to 0.30.x
          (0.31 reads every route); vllm-ascend's CaMemAllocator asserts on PYTORCH_NPU_ALLOC_CONF, never toggles
Affects:  vllm >=0.8.0 with enable_sleep_mode=True (the guard: CUDA/ROCm with vLLM <0.31 on torch builds that
          bypass, every vllm-ascend on NPU; the check and telemetry: every release); vllm-ascend >=0.13.0rc1
Remove:   guard when the minimum vLLM is >=0.31 and vllm-ascend toggles expandable segments; the check: never

A sleep frees only what vLLM's sleep pool holds, and nothing says when it freed nothing: the guard keeps the
engine's memory in the pool, the check measures every sleep (records on the engine, ``vllm.LLM``, the worker,
vllm-ascend's ``NPUWorker`` and the engine core; the behaviour lives in ``shim/vllm``).
"""
from shim.engine.patch import Patch
from shim.engine.probes import missing


def _no_device():
    import importlib

    from shim.vllm.sleep import memory

    try:
        importlib.import_module("vllm.platforms")
    except Exception:
        pass
    if memory.probe() is not None:
        return None
    return "no CUDA or NPU device (torch.cuda / torch.npu): no device memory to manage"


def _guard_needed():
    """Stand down where vLLM keeps expandable segments off around its pool on every route itself and the
    guard's live write would only drop the user's other allocator options (CUDA, vLLM 0.31+:
    ``shim.vllm.sleep.alloc_guard.upstream_covers``); the NPU guard stays (vllm-ascend only asserts)."""
    from shim.vllm.sleep import alloc_guard, memory

    return alloc_guard.upstream_covers(memory.probe())


def _probe_engine(module):
    return missing(getattr(module, "LLMEngine", None), ("__init__", "sleep", "wake_up"), "LLMEngine") or _no_device()


def _probe_llm(module):
    return missing(getattr(module, "LLM", None), ("__init__", "sleep", "wake_up"), "LLM") or _no_device()


_WORKER_GUARDED = ("load_model", "initialize_from_config", "wake_up")
_WORKER_CHECKED = ("__init__", "sleep", "wake_up")


def _probe_worker(names, class_name="Worker", own=False, guard=False):
    """``own``: the class itself must define ``names`` (NPUWorker: what it inherits is not the method the
    records are written for). ``guard``: the allocator guard's record (:func:`_guard_needed`)."""
    def probe(module):
        worker = getattr(module, class_name, None)
        return (missing(worker, names, class_name, own=own) or _no_device()
                or (_guard_needed() if guard else None))

    return probe


def _probe_engine_guard(module):
    return _probe_engine(module) or _guard_needed()


def _worker_guard(class_name):
    def apply(module, patcher):
        from shim.vllm.sleep import alloc_guard, engine_guard, memory, worker_check

        worker = getattr(module, class_name)
        alloc_guard.track_live_setting(memory.probe(), patcher)
        for name in ("load_model", "initialize_from_config"):
            patcher.wrap(worker, name, worker_check.guard_alloc)
        patcher.wrap(worker, "wake_up", engine_guard.guard_wake)  # the engine's wake guard serves a worker too

    return apply


def _worker_check(class_name):
    def apply(module, patcher):
        from shim.vllm.sleep import worker_check

        worker = getattr(module, class_name)
        patcher.wrap(worker, "__init__", worker_check.check_init)
        patcher.wrap(worker, "sleep", worker_check.check_sleep)
        patcher.wrap(worker, "wake_up", worker_check.check_wake)
        if callable(vars(worker).get("discard")):  # vLLM >= 0.31: the KV cache released without a sleep
            patcher.wrap(worker, "discard", worker_check.check_discard)

    return apply


def _probe_core(module):
    return missing(getattr(module, "EngineCore", None), ("wake_up",), "EngineCore") or _no_device()


def _apply_core_wake(module, patcher):
    from shim.vllm.sleep import core_wake

    patcher.wrap(module.EngineCore, "wake_up", core_wake.plan_wake)


def _apply_guard(module, patcher):
    from shim.vllm.sleep import alloc_guard, engine_guard, memory

    alloc_guard.track_live_setting(memory.probe(), patcher)
    patcher.wrap(module.LLMEngine, "__init__", engine_guard.guard_init)
    patcher.wrap(module.LLMEngine, "wake_up", engine_guard.guard_wake)


def _apply_check(owner_name, init_name):
    def apply(module, patcher):
        from shim.vllm.sleep import sleep_check

        owner = getattr(module, owner_name)
        patcher.wrap(owner, "__init__", getattr(sleep_check, init_name))
        patcher.wrap(owner, "sleep", sleep_check.check_sleep)
        patcher.wrap(owner, "wake_up", sleep_check.check_wake)

    return apply


_ISSUE = "modelscope/ms-swift#6636"
_AFFECTED = ">=0.8.0"

GUARD = Patch(
    id="vllm-sleep-guard",
    tested_at=("vllm", "0.24.0"),
    issue=_ISSUE,
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.v1.engine.llm_engine",
    apply=_apply_guard,
    probe=_probe_engine_guard,
    summary="expandable segments off (4 env vars + live setting) while a sleep-mode engine is built or woken; "
            "the user's setting restored exactly afterwards (stands down on CUDA with vLLM 0.31+, which does it "
            "itself and keeps the user's other allocator options)",
    verified=("CPU: stand-in 0.33.0/0.34.0 CUDA with `expandable_segments:True,max_split_size_mb:256`: the option "
              "survives build, sleep and wake (dropped by the guard before, asserted), the pool still frees; "
              "stand-in, every route in NPU and old-torch CUDA modes: shim off frees ~0 (asserted), on >= 90%; "
              "each of the four env vars reads `expandable_segments:False` inside the engine build, also in a "
              "child process started there (on without the shim, asserted); a fault inside the wrapped build or "
              "wake (error, `KeyboardInterrupt`, OOM) leaves the user's setting back "
              "(`tests/unit/test_sleep_faults.py`); ms-swift 3.10.0/3.10.1/4.6.0 first sleep likewise. H200: every "
              "route frees 99.94% (level 1) / 100% (level 2) of the pool, setting restored"),
    changes=("`LLMEngine.__init__`/`wake_up`: expandable segments off (all four env vars and the live setting) "
             "while the engine fills its sleep pool; your exact setting back afterwards, so training keeps it. "
             "Stands down on CUDA with vLLM 0.31+ (fixed upstream: `device_allocator/alloc_conf.py` rewrites the "
             "whole allocator string around the pool on every route; the guard's bare live write would make torch "
             "drop `max_split_size_mb` and the like); the NPU guard stays `vllm.LLM` builds and wakes through "
             "`LLMEngine`, ms-swift calls it directly; the guard is `shim.vllm.sleep.engine_guard` and "
             "`shim.vllm.sleep.alloc_guard`. On CUDA/ROCm with vLLM 0.31+ the guard records stand down because the "
             "guard's bare live write would drop the user's `max_split_size_mb` / `garbage_collection_threshold` / "
             "`roundup_power2_divisions`. Every record of this module stands down with one line when neither CUDA "
             "(`torch.cuda`) nor an Ascend NPU (`torch.npu`) is the device."),
)

CHECK = Patch(
    id="vllm-sleep-check",
    tested_at=("vllm", "0.24.0"),
    kind="check",
    issue=_ISSUE,
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.v1.engine.llm_engine",
    apply=_apply_check("LLMEngine", "check_init"),
    probe=_probe_engine,
    summary="every sleep verified (pool-tracked vs freed bytes: device readings on first/suspect/every 10th "
            "sleep, the pool's bookkeeping otherwise), first-sleep reset after warm-up, per-tag wake, telemetry",
    verified=("CPU: stand-in, CUDA and NPU; a pool that tracks real memory and gives back 40% is ineffective, 60% "
              "is not; a sleep the pool says freed but the device did not is caught at the N-th sleep with device "
              "figures; faults inside every wrapper: same exception to the caller, sleep state = the executor's, "
              "next sleep/wake works; H200 (2026-11-30, every sleep then read on the device): the shim's per-sleep "
              "figures equal `torch.cuda.mem_get_info` (0.00% apart); a sleep verified from the pool's bookkeeping "
              "reports the pool's bytes, which that run's device figures were within 0.06% of; #9563: 50 "
              "sleep/wake cycles on the stand-in's NPU mode (vllm-ascend 0.13.0rc1, the issue's 240 MB workspace "
              "per wake): +11.5 GiB without the shim (asserted), flat with it, also with vLLM >=0.30 where only "
              "the release after the sleep acts; flat without the shim on vllm-ascend 0.19.1rc1"),
    changes=("`LLMEngine.__init__`/`sleep`/`wake_up`: each sleep checked (bytes the sleep pool tracked vs bytes "
             "the device got back; read on the device on the first sleep per level, suspect sleeps and every 10th, "
             "from the pool's bookkeeping otherwise), one WARNING with cause and fix when a sleep frees less than "
             "half, first-sleep reset after warm-up (re-checked, re-issued once if still ineffective), per-tag "
             "wake (gc + `empty_cache` first), sleep while partially awake made effective, telemetry. On NPU every "
             "sleep is followed by gc + `torch.npu.empty_cache()` (the #9563 fix; it was already there). The check "
             "is `shim.vllm.sleep.sleep_check` (verdict: `shim.vllm.sleep.sleep_verdict`; first-sleep reset: "
             "`shim.vllm.sleep.first_sleep_reset`; one telemetry event per construction/sleep/wake: "
             "`shim.observe.events`). Only the outermost of `vllm-sleep-check` and `vllm-llm-sleep-check` acts on "
             "a sleep or wake (`LLM.sleep` delegates to `LLMEngine.sleep`), state keyed by the engine."),
)

LLM_CHECK = Patch(
    id="vllm-llm-sleep-check",
    tested_at=("vllm", "0.24.0"),
    kind="check",
    issue=_ISSUE,
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.entrypoints.llm",
    apply=_apply_check("LLM", "check_llm_init"),
    probe=_probe_llm,
    summary="as vllm-sleep-check, on vllm.LLM (outermost wrapper acts, no double counting)",
    verified="CPU: vLLM stand-in (CUDA and NPU modes)",
    changes="the same on `vllm.LLM` (the outermost wrapper acts; no double counting)",
)

WORKER_GUARD = Patch(
    id="vllm-worker-sleep-guard",
    tested_at=("vllm", "0.24.0"),
    issue=_ISSUE,
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.v1.worker.gpu_worker",
    apply=_worker_guard("Worker"),
    probe=_probe_worker(_WORKER_GUARDED, guard=True),
    summary="as vllm-sleep-guard, in the worker's process (AsyncLLM / multiprocessing engine core): "
            "Worker.load_model, initialize_from_config and wake_up",
    verified=("CPU: the stand-in's `AsyncLLM` with its engine core in a subprocess (fork and spawn): the worker's "
              "sleep record comes from the engine core's pid; an ineffective sleep there is one WARNING. Real "
              "OpenRLHF 0.11.2 `RolloutRayActor` (`create_vllm_engines`, two PPO steps, no Ray cluster: the class "
              "under `ray.remote`) under `python -m shim`: 3 sleep records from the engine core's pid, level 1, "
              "effective; without the shim none (asserted)"),
    changes=("the same allocator guard and sleep check on vLLM's worker (`vllm.v1.worker.gpu_worker.Worker` "
             "construction, `sleep`, `wake_up`), in whichever process holds the device memory: vLLM's engine-core "
             "subprocess under `AsyncLLM` (verl, OpenRLHF, `vllm serve`), Ray actors. An in-process worker under "
             "an engine the shim already wraps passes through (no double counting); trace records carry the "
             "worker's pid and parent pid, `report` groups them under the trainer's run. Where the engine core runs "
             "in its own process (`AsyncLLM`; `vllm.LLM` with vLLM's default `VLLM_ENABLE_V1_MULTIPROCESSING=1`) "
             "the engine-level wrappers see no executor; these records (`shim.vllm.sleep.worker_check`) wrap "
             "`Worker.load_model`, `initialize_from_config`, `wake_up` (guard) and `__init__`, `sleep`, `wake_up` "
             "(check)."),
)

WORKER_CHECK = Patch(
    id="vllm-worker-sleep-check",
    tested_at=("vllm", "0.24.0"),
    kind="check",
    issue=_ISSUE,
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.v1.worker.gpu_worker",
    apply=_worker_check("Worker"),
    probe=_probe_worker(_WORKER_CHECKED),
    summary="as vllm-sleep-check, on vLLM's Worker where the memory lives (the engine-core process of AsyncLLM); "
            "passes through where an in-process engine's check acts (one record per sleep)",
    changes=("the same allocator guard and sleep check on vLLM's worker (`vllm.v1.worker.gpu_worker.Worker` "
             "construction, `sleep`, `wake_up`), in whichever process holds the device memory: vLLM's engine-core "
             "subprocess under `AsyncLLM` (verl, OpenRLHF, `vllm serve`), Ray actors. An in-process worker under "
             "an engine the shim already wraps passes through (no double counting); trace records carry the "
             "worker's pid and parent pid, `report` groups them under the trainer's run. On vLLM >= 0.31: "
             "`Worker.discard` (`release_kv_cache_memory`) is recorded on the worker's state; the worker's wake "
             "passes vLLM's tags on unchanged (vLLM's executor has checked them); a sleep is woken first only "
             "where the executor refuses it (`weights` asleep) and judged on the tags still mapped"),
    verified=("CPU: the stand-in's `AsyncLLM` with its engine core in a subprocess (fork and spawn): the worker's "
              "sleep record comes from the engine core's pid; an ineffective sleep there is one WARNING. Real "
              "OpenRLHF 0.11.2 `RolloutRayActor` (`create_vllm_engines`, two PPO steps, no Ray cluster: the class "
              "under `ray.remote`) under `python -m shim`: 3 sleep records from the engine core's pid, level 1, "
              "effective; without the shim none (asserted) vLLM >= 0.31: CPU: stand-in 0.31.0 and 0.34.0, "
              "`AsyncLLM` with a forked engine core and an in-process `LLM`: pause, `release_kv_cache_memory`, "
              "`wake_up([\"kv_cache\"])`, rollout; before the fix the shim skipped the worker's KV wake and the "
              "rollout hit unmapped memory; a sleep after a discard re-maps nothing and is judged effective on the "
              "weights alone"),
)

NPU_WORKER_GUARD = Patch(
    id="vllm-ascend-worker-sleep-guard",
    tested_at=("vllm-npu", "0.24.0"),
    issue=_ISSUE,
    distribution="vllm-ascend",
    affected=">=0.13.0rc1",
    module="vllm_ascend.worker.worker",
    apply=_worker_guard("NPUWorker"),
    probe=_probe_worker(_WORKER_GUARDED, "NPUWorker", own=True, guard=True),
    summary="as vllm-worker-sleep-guard, on vllm-ascend's NPUWorker (its own methods: the records on Worker miss it)",
    changes=("the same two on vllm-ascend's `vllm_ascend.worker.worker.NPUWorker`: it subclasses vLLM's "
             "`WorkerBase`, not `Worker` (vllm-ascend 0.23.0 `worker/worker.py:89`), and defines `__init__` (:90), "
             "`sleep` (:216), `wake_up` (:241), `load_model` (:681) and `initialize_from_config` (:907) itself, so "
             "the records on `Worker` never reach it; the probe asks for the class's own methods"),
    verified=("CPU: the stand-in in NPU mode (its `NPUWorker` keeps those methods its own), `AsyncLLM` with the "
              "engine core forked, expandable segments on through `PYTORCH_ALLOC_CONF`: without the shim both "
              "sleeps free ~0 (pool empty), with it they free the pool and the check records them from the engine "
              "core's pid as `NPUWorker#1`"),
)

NPU_WORKER_CHECK = Patch(
    id="vllm-ascend-worker-sleep-check",
    tested_at=("vllm-npu", "0.24.0"),
    kind="check",
    issue=_ISSUE,
    distribution="vllm-ascend",
    affected=">=0.13.0rc1",
    module="vllm_ascend.worker.worker",
    apply=_worker_check("NPUWorker"),
    probe=_probe_worker(_WORKER_CHECKED, "NPUWorker", own=True),
    summary="as vllm-worker-sleep-check, on vllm-ascend's NPUWorker",
    changes=NPU_WORKER_GUARD.changes,
    verified=NPU_WORKER_GUARD.verified,
)

CORE_WAKE = Patch(
    id="vllm-core-wake-plan",
    tested_at=("vllm", "0.24.0"),
    issue="vLLM Executor.wake_up drops a wake naming an awake tag",
    distribution="vllm",
    affected=_AFFECTED,
    module="vllm.v1.engine.core",
    apply=_apply_core_wake,
    probe=_probe_core,
    summary="EngineCore.wake_up (the engine core of AsyncLLM / multiprocessing LLM, in its own process) passes "
            "only the requested tags that are asleep, as vllm-sleep-check does in process; once per wake",
    verified=("CPU: the stand-in's `AsyncLLM` (spawned and forked engine cores): without the shim the second wake "
              "is dropped in the core and the next rollout fails (the stand-in raises where vLLM waits); with it "
              "the worker wakes `weights` then `kv_cache` and the rollout equals the first"),
    changes=("`vllm.v1.engine.core.EngineCore.wake_up` passes only the requested tags the executor reports asleep "
             "(plus `scheduling`): vLLM's `Executor.wake_up` drops a whole wake that names an awake tag (0.24.0 "
             "`v1/executor/abstract.py:331-343`), and 0.24's `EngineCore.wake_up` resumes the scheduler only once "
             "the executor is fully awake (`v1/engine/core.py:799-815`), so `wake_up([\"weights\"])` then "
             "`wake_up([\"weights\", \"kv_cache\"])` leaves an `AsyncLLM` that accepts requests and never runs them. "
             "The engine-level check does this where it sees the executor; in an engine-core process only this "
             "wrapper does. An in-process core (`InprocClient`) is adopted by the engine's check and passes "
             "through. The wrapper is `shim.vllm.sleep.core_wake`, with the engine-level check's wake rule "
             "(`shim.vllm.sleep.wake_plan`), in whatever process holds the executor."),
)

PATCHES = [GUARD, CHECK, LLM_CHECK, WORKER_GUARD, WORKER_CHECK, NPU_WORKER_GUARD, NPU_WORKER_CHECK, CORE_WAKE]
