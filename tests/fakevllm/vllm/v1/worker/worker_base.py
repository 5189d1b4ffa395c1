"""Mirrors vllm/v1/worker/worker_base.py: WorkerBase, WorkerWrapperBase
(``driver_worker``; attribute access is forwarded to the wrapped worker)."""
from vllm.v1.worker.gpu_worker import WorkerBase  # noqa: F401


class WorkerWrapperBase:
    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, attr):
        return getattr(self.worker, attr)
