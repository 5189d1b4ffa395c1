"""What the shim reads off a vLLM engine, in one place. Nothing here imports vLLM.

``vllm.LLM`` delegates sleep and wake to its ``llm_engine`` (``LLMEngine``), whose ``model_executor`` knows
which tags are asleep (``sleeping_tags``, vLLM's ``ExecutorBase``; ``is_sleeping`` True while any is). Every
other module asks here: :func:`engine_of` (the object that owns the sleep state), :func:`executor_of`,
:func:`in_process_workers` (the executor's workers that live in this process), :func:`in_process_core` (the
``EngineCore`` an in-process client holds), :func:`executor_tags` / :func:`reported_asleep` (what vLLM reports
asleep, or None where the executor does not say), :func:`sleep_mode` (``enable_sleep_mode`` of a built
engine), what a sleep gives back beside the pool (:func:`outside_pool_bytes`: vLLM 0.34's extensible KV cache)
and the plain tensors a worker keeps on the host across a level-2 sleep (:func:`kept_on_host`). The device an
engine runs on is ``shim.vllm.sleep.memory.device_type``.
"""
from __future__ import annotations

TAGS = ("weights", "kv_cache")
"""The sleep pool's tags, in vLLM's documented wake order."""


def unproxy(handle):
    """``handle`` without the proxies around it (the shim's synced ``LLM``: ``__wrapped__``)."""
    seen = 0
    while hasattr(handle, "__wrapped__") and seen < 8:
        handle = handle.__wrapped__
        seen += 1
    return handle


def unwrap(handle):
    """vLLM's engine behind any handle the trainers hold: a proxy of the shim's (``__wrapped__``),
    ``vllm.LLM`` (its ``llm_engine``), ms-swift's ``VllmEngine`` (its ``engine``), or the engine itself."""
    handle = unproxy(handle)
    engine = getattr(handle, "llm_engine", None)
    if engine is None:
        inner = getattr(handle, "engine", None)
        engine = inner if getattr(inner, "model_executor", None) is not None else handle
    return engine


def engine_of(obj):
    """The object that owns the sleep state: ``LLM.llm_engine``, or the engine itself."""
    return getattr(obj, "llm_engine", None) or obj


def executor_of(obj):
    """The in-process executor (``LLM.llm_engine.model_executor``), or None."""
    return getattr(engine_of(obj), "model_executor", None)


def in_process_workers(obj) -> list:
    """The vLLM workers of ``obj``'s executor that live in this process: ``driver_worker`` of
    vLLM's ``UniProcExecutor`` / ``ExecutorWithExternalLauncher`` (a ``WorkerWrapperBase``: its
    ``worker``); empty for an executor whose workers are other processes (``MultiprocExecutor``)."""
    wrapper = getattr(executor_of(obj), "driver_worker", None)
    if wrapper is None:
        return []
    worker = getattr(wrapper, "worker", None) or wrapper
    return [worker] if callable(getattr(worker, "sleep", None)) else []


def in_process_core(obj):
    """The ``vllm.v1.engine.core.EngineCore`` of ``obj``'s engine where it runs in this process: vLLM's
    ``LLMEngine.engine_core`` is an ``InprocClient`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) whose
    ``engine_core`` is the core (0.24 ``llm_engine.py:125`` reads ``model_executor`` off it); None for
    a client of a core in another process (``SyncMPClient`` / ``AsyncMPClient``)."""
    client = getattr(engine_of(obj), "engine_core", None)
    core = getattr(client, "engine_core", None)
    return core if getattr(core, "model_executor", None) is not None else None


def executor_tags(executor) -> "set | None":
    """The tags ``executor`` reports asleep (empty while ``is_sleeping`` is False); None where it
    has no ``sleeping_tags`` collection (an executor of another shape, or none)."""
    tags = getattr(executor, "sleeping_tags", None)
    if not isinstance(tags, (set, frozenset, list, tuple)):
        return None
    return set(tags) if getattr(executor, "is_sleeping", bool(tags)) else set()


def reported_asleep(obj) -> "set | None":
    """:func:`executor_tags` of ``obj``'s executor."""
    return executor_tags(executor_of(obj))


def sleep_mode(engine) -> "bool | None":
    """``enable_sleep_mode`` of a built engine (``vllm_config.model_config`` or ``model_config``)."""
    for cfg in (getattr(getattr(engine, "vllm_config", None), "model_config", None),
                getattr(engine, "model_config", None)):
        value = getattr(cfg, "enable_sleep_mode", None)
        if value is not None:
            return bool(value)
    return None


SAVED_PLAIN = "_shim_sleep_saved_plain"
"""Worker attribute (set by ``shim.vllm.weights.buffers``): ``{storage pointer: (device storage, host copy)}``
between a level-2 sleep and the weights wake."""


def kept_on_host(engine) -> tuple:
    """``(storages, bytes)`` of the plain tensors ``engine``'s worker (or the worker itself) keeps on the host
    for its weights wake; ``(0, 0)`` where it keeps none or cannot be read (a worker proxy may raise)."""
    try:
        worker = getattr(executor_of(engine), "driver_worker", None) or engine
        saved = getattr(worker, SAVED_PLAIN, None) or {}
        return len(saved), sum(host.nbytes() for _, host in saved.values())
    except Exception:
        return 0, 0


def extensible_kv_cache(worker):
    """vLLM 0.34's extensible KV cache of ``worker`` (``model_runner.extensible_kv_cache``), or None."""
    return getattr(getattr(worker, "model_runner", None), "extensible_kv_cache", None)


def outside_pool_bytes(engine, committed: bool = False) -> int:
    """Pages the extensible KV caches of ``engine`` (a worker, or an engine with in-process workers) hold
    now: device memory a sleep gives back beside the pool; ``committed``: what they map when awake
    (``physical_bytes_for(num_committed_blocks)``, kept across a release). 0 without one."""
    total = 0
    for holder in [engine] + in_process_workers(engine):
        cache = extensible_kv_cache(holder)
        try:
            if committed and callable(getattr(cache, "physical_bytes_for", None)):
                total += int(cache.physical_bytes_for(int(cache.num_committed_blocks)))
            else:
                total += int(getattr(cache, "physical_bytes", 0) or 0)
        except Exception:
            continue
    return total
