"""vLLM sleeps that free nothing: allocator guard, verified sleeps, per-tag wake, telemetry.

Upstream: modelscope/ms-swift#6636 (first sleep frees 0.00 GiB on Ascend); pytorch/pytorch#147851
          (expandable segments bypass a pluggable allocator's MemPool); vLLM reads only
          PYTORCH_CUDA_ALLOC_CONF up to 0.30.x (0.31 reads every route); vllm-ascend's CaMemAllocator
          asserts on the PYTORCH_NPU_ALLOC_CONF string and never toggles (every release so far)
Affects:  vllm >=0.8.0 with enable_sleep_mode=True (guard: CUDA/ROCm with vLLM <0.31 on torch builds that
          bypass, and every vllm-ascend on NPU; verification, per-tag wake and telemetry: every release);
          vllm-ascend >=0.13.0rc1 (its NPUWorker, vllm_ascend.worker.worker). On CUDA/ROCm with vLLM 0.31+
          the guard records stand down (fixed upstream: device_allocator/alloc_conf.py rewrites the whole
          allocator string around the pool; the guard's bare live write would drop the user's
          max_split_size_mb / garbage_collection_threshold / roundup_power2_divisions)
Remove:   guard when the shim's minimum vLLM is >=0.31 and vllm-ascend toggles expandable segments itself;
          the verification and telemetry have no upstream equivalent

Three records on the engines trainers build; the behaviour lives in ``shim/``:

- ``vllm-sleep-guard`` (``vllm.v1.engine.llm_engine.LLMEngine.__init__`` and
  ``wake_up``; ``vllm.LLM`` builds and wakes through it, ms-swift calls it
  directly): the allocator guard (``shim.vllm.sleep.engine_guard``, ``shim.vllm.sleep.alloc_guard``):
  while a sleep-mode engine allocates into its pool, expandable segments are off
  whichever of the four env vars or the live setting turned them on; the user's
  exact setting is back afterwards.
- ``vllm-sleep-check`` (``LLMEngine.__init__``, ``sleep``, ``wake_up``) and
  ``vllm-llm-sleep-check`` (``vllm.entrypoints.llm.LLM``, same methods): the
  sleep check (``shim.vllm.sleep.sleep_check``): every sleep verified (``shim.vllm.sleep.sleep_verdict``:
  device readings where needed, the pool's bookkeeping otherwise), the first-sleep
  reset after warm-up (``shim.vllm.sleep.first_sleep_reset``), per-tag wake, one telemetry
  event per construction/sleep/wake (``shim.observe.events``). Only the outermost of
  the two acts on a sleep or wake (``LLM.sleep`` delegates to ``LLMEngine.sleep``),
  state keyed by the engine.

Two more on ``vllm.v1.worker.gpu_worker.Worker``, for the engine core in its own process
(``AsyncLLM``: verl, OpenRLHF, ``vllm serve``; ``vllm.LLM`` with vLLM's default
``VLLM_ENABLE_V1_MULTIPROCESSING=1``), where the worker holds the memory and the engine-level
wrappers above see no executor (``shim.vllm.sleep.worker_check``):

- ``vllm-worker-sleep-guard`` (``load_model``, ``initialize_from_config``, ``wake_up``): the
  allocator guard around the worker's pool allocations and its wake;
- ``vllm-worker-sleep-check`` (``__init__``, ``sleep``, ``wake_up``): the sleep check on the
  worker's own state, records with the worker process's pid. Where an in-process engine's check
  acts on the same sleep (TRL / ms-swift colocate), the worker's passes through: one record per sleep.

The same two on vllm-ascend's ``vllm_ascend.worker.worker.NPUWorker`` (``vllm-ascend-worker-sleep-guard``,
``vllm-ascend-worker-sleep-check``): it subclasses vLLM's ``WorkerBase``, not ``Worker`` (0.23.0
``worker.py:89``), and defines ``__init__``, ``sleep``, ``wake_up``, ``load_model`` and
``initialize_from_config`` itself, so the records on ``Worker`` never reach it.

One on ``vllm.v1.engine.core.EngineCore`` (``shim.vllm.sleep.core_wake``), in whatever process holds the
executor:

- ``vllm-core-wake-plan`` (``wake_up``): the per-tag wake rule of the engine-level check
  (``shim.vllm.sleep.wake_plan``: only the requested tags that are asleep are passed; vLLM's executor
  drops a wake naming an awake tag, and 0.24's core then never resumes its scheduler) for the
  engine core in its own process, where no engine-level wrapper sees the wake; passes through
  where an in-process engine's check planned it.

All of them stand down with one line when neither CUDA (``torch.cuda``) nor an
Ascend NPU (``torch.npu``) is the device.
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
    verified="CPU: vLLM stand-in, NPU and old-torch CUDA bypass modes, every route; 0.33.0/0.34.0 CUDA stand down",
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
    verified="CPU: vLLM stand-in (CUDA and NPU modes)",
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
    verified="CPU: vLLM stand-in AsyncLLM, engine core spawned and forked",
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
    verified="CPU: vLLM stand-in AsyncLLM, engine core spawned and forked; in-process LLM",
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
    verified="CPU: vLLM stand-in in NPU mode, AsyncLLM engine core forked",
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
    verified="CPU: vLLM stand-in in NPU mode, AsyncLLM engine core forked; in-process LLM",
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
    verified="CPU: vLLM stand-in AsyncLLM, engine core spawned and forked (weights woken, then both tags)",
)

PATCHES = [GUARD, CHECK, LLM_CHECK, WORKER_GUARD, WORKER_CHECK, NPU_WORKER_GUARD, NPU_WORKER_CHECK, CORE_WAKE]
