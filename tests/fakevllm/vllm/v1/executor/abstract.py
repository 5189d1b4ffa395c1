"""Mirrors vllm/v1/executor/abstract.py ``Executor`` (sleep/wake_up guards, 0.31+ ``discard``,
``is_sleeping`` / ``sleeping_tags`` bookkeeping, ``collective_rpc``) and
vllm/v1/executor/uniproc_executor.py ``UniProcExecutor`` /
``ExecutorWithExternalLauncher`` (one worker in this process, ``driver_worker``),
with ``run_method`` from vllm/v1/serial_utils.py.
"""
from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from vllm import _fake
from vllm.logger import init_logger

logger = init_logger(__name__)


def run_method(obj: Any, method: str | bytes | Callable, args: tuple, kwargs: dict) -> Any:
    if isinstance(method, bytes):
        import pickle
        func = partial(pickle.loads(method), obj)
    elif isinstance(method, str):
        try:
            func = getattr(obj, method)
        except AttributeError:
            raise NotImplementedError(f"Method {method!r} is not implemented.") from None
    else:
        func = partial(method, obj)
    return func(*args, **kwargs)


class Executor:
    uses_ray = False
    supports_pp = False

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.parallel_config = vllm_config.parallel_config
        self.is_sleeping = False
        self.sleeping_tags: set[str] = set()
        self.kv_output_aggregator = None
        self._init_executor()

    @staticmethod
    def get_class(vllm_config) -> type["Executor"]:
        backend = vllm_config.parallel_config.distributed_executor_backend
        if isinstance(backend, type):
            return backend
        if backend in (None, "uni", "mp", "ray"):
            return UniProcExecutor  # the fake runs every backend in-process
        if backend == "external_launcher":
            return ExecutorWithExternalLauncher
        raise ValueError(f"Unknown distributed executor backend: {backend}")

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None, non_block: bool = False, unique_reply_rank=None):
        return [run_method(self.driver_worker, method, args, kwargs or {})]

    def determine_available_memory(self) -> list[int]:
        return self.collective_rpc("determine_available_memory")

    def initialize_from_config(self, kv_cache_bytes: int) -> None:
        self.collective_rpc("initialize_from_config", args=(kv_cache_bytes,))
        self.collective_rpc("compile_or_warm_up_model")

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def reset_prefix_cache(self) -> bool:
        return all(self.collective_rpc("reset_prefix_cache"))

    def add_lora(self, lora_request) -> bool:
        return all(self.collective_rpc("add_lora", args=(lora_request,)))

    def remove_lora(self, lora_id: int) -> bool:
        return all(self.collective_rpc("remove_lora", args=(lora_id,)))

    def list_loras(self) -> set:
        """vllm/executor/executor_base.py: every worker holds the same adapters."""
        sets = self.collective_rpc("list_loras")
        for s in sets:
            assert s == sets[0], "All workers should have the same LORAs."
        return sets[0]

    def _sleep_refused(self) -> bool:
        """Up to 0.30: any tag asleep refuses the sleep; 0.31+ (``v1/executor/abstract.py``): only
        ``"weights"`` asleep does (a KV cache discarded by ``discard`` does not)."""
        if _fake.V >= _fake.Version("0.31.0"):
            return "weights" in self.sleeping_tags
        return self.is_sleeping

    def sleep(self, level: int = 1):
        if self._sleep_refused():
            logger.warning("Executor is already sleeping.")
            _fake.log_event("executor_guard", what="sleep", level=level, note="Executor is already sleeping.")
            return
        time_before_sleep = time.perf_counter()
        self.collective_rpc("sleep", kwargs=dict(level=level))
        time_after_sleep = time.perf_counter()
        self.sleeping_tags |= {"weights", "kv_cache"}
        self.is_sleeping = True
        logger.info("It took %.6f seconds to fall asleep.", time_after_sleep - time_before_sleep)
        _fake.log_event("sleep", level=level, seconds=time_after_sleep - time_before_sleep,
                        freed_bytes=_fake.EVENTS[-1].get("freed_bytes") if _fake.EVENTS else None)

    def wake_up(self, tags: list[str] | None = None):
        if not self.is_sleeping:
            logger.warning("Executor is not sleeping.")
            _fake.log_event("executor_guard", what="wake_up", tags=tags, note="Executor is not sleeping.")
            return
        if tags:
            for tag in tags:
                if tag not in self.sleeping_tags:
                    logger.warning("Tag %s is not in sleeping tags %s", tag, self.sleeping_tags)
                    _fake.log_event("executor_guard", what="wake_up", tags=tags,
                                    note=f"Tag {tag} is not in sleeping tags {sorted(self.sleeping_tags)}")
                    return
        time_before_wakeup = time.perf_counter()
        self.collective_rpc("wake_up", kwargs=dict(tags=tags))
        time_after_wakeup = time.perf_counter()
        logger.info("It took %.6f seconds to wake up tags %s.", time_after_wakeup - time_before_wakeup,
                    tags if tags is not None else self.sleeping_tags)
        if tags:
            for tag in tags:
                self.sleeping_tags.remove(tag)
        else:
            self.sleeping_tags.clear()
        if not self.sleeping_tags:
            self.is_sleeping = False
        _fake.log_event("wake_up", tags=tags, sleeping_tags=sorted(self.sleeping_tags))

    def discard(self, tags: tuple[str, ...]) -> None:
        """0.31+ ``Executor.discard``: the tags not asleep yet go to every worker's ``discard`` and are
        marked asleep (even when the call raises); a later ``wake_up(tags)`` maps them again."""
        tags_to_discard = set(tags) - self.sleeping_tags
        if not tags_to_discard:
            logger.warning("Tags %s are already sleeping.", tags)
            return
        try:
            self.collective_rpc("discard", args=(tuple(tags_to_discard),))
        finally:
            self.sleeping_tags |= tags_to_discard
            self.is_sleeping = True
        _fake.log_event("discard", tags=sorted(tags_to_discard), sleeping_tags=sorted(self.sleeping_tags))


if _fake.V < _fake.Version("0.31.0"):
    del Executor.discard


class UniProcExecutor(Executor):
    def _worker_cls(self):
        if _fake.DEVICE_TYPE == "npu":
            from vllm_ascend.worker.worker import NPUWorker
            return NPUWorker
        from vllm.v1.worker.gpu_worker import Worker
        return Worker

    def _init_executor(self) -> None:
        import os

        from vllm.v1.worker.worker_base import WorkerWrapperBase
        rank = int(os.environ.get("RANK", "0")) if self._external else 0
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self._external else 0
        worker = self._worker_cls()(vllm_config=self.vllm_config, local_rank=local_rank, rank=rank,
                                    is_driver_worker=True)
        self.driver_worker = WorkerWrapperBase(worker)
        self.collective_rpc("init_device")
        self.collective_rpc("load_model")

    _external = False


class ExecutorWithExternalLauncher(UniProcExecutor):
    """Worker in the trainer's own process (torchrun env RANK/LOCAL_RANK)."""
    _external = True
