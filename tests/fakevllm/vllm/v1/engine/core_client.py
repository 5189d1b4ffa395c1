"""Mirrors vllm/v1/engine/core_client.py (0.24): ``EngineCoreClient.make_async_mp_client`` ->
``AsyncMPClient`` (an ``MPClient`` in asyncio mode), the client of an engine core in a background
process.

``MPClient.__init__`` starts the engine core (upstream: ``launch_core_engines`` ->
``CoreEngineProcManager``, vllm/v1/engine/utils.py: ``get_mp_context().Process(target=
EngineCoreProc.run_engine_core, name="EngineCore", kwargs=...)``, then ``proc.start()``) and waits
for its ready message. The multiprocessing method is ``VLLM_WORKER_MULTIPROC_METHOD``
(``vllm.utils.system_utils.get_mp_context``). Utility calls (``call_utility_async(method, *args)``:
``sleep``, ``wake_up``, ``is_sleeping``, ``collective_rpc``, ``reset_prefix_cache``) run in the
engine-core process and return its result or raise its exception. Upstream sends them over ZMQ
with a call id and resolves a future from its output queue task; the stand-in keeps one Pipe,
one request at a time (a lock), the blocking exchange run in the event loop's default executor.
``shutdown`` stops the process (upstream: SIGTERM, then SIGKILL after a timeout).
"""
from __future__ import annotations

import asyncio
import threading
import weakref

from vllm.logger import init_logger

logger = init_logger(__name__)


class EngineCoreClient:
    @staticmethod
    def make_async_mp_client(vllm_config, executor_class, log_stats: bool, client_addresses=None,
                             client_count: int = 1, client_index: int = 0) -> "AsyncMPClient":
        return AsyncMPClient(vllm_config, executor_class, log_stats, client_addresses, client_count, client_index)


def _stop(proc, conn) -> None:
    try:
        if proc.is_alive():
            try:
                conn.send(("shutdown",))
                if conn.poll(10):
                    conn.recv()
            except (OSError, EOFError, BrokenPipeError):
                pass
            proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
    finally:
        conn.close()


class MPClient(EngineCoreClient):
    def __init__(self, asyncio_mode: bool, vllm_config, executor_class, log_stats: bool, client_addresses=None):
        from vllm.utils.system_utils import get_mp_context
        from vllm.v1.engine.core import EngineCoreProc

        self.vllm_config = vllm_config
        context = get_mp_context()
        self._conn, child = context.Pipe()
        self.proc = context.Process(target=EngineCoreProc.run_engine_core, name="EngineCore",
                                    kwargs={"vllm_config": vllm_config, "executor_class": executor_class,
                                            "log_stats": log_stats, "conn": child, "dp_rank": 0,
                                            "local_dp_rank": 0},
                                    daemon=True)
        self.proc.start()
        child.close()
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self._conn)
        try:
            kind, value = self._conn.recv()
        except EOFError:
            self._finalizer()
            raise RuntimeError("Engine core initialization failed. See root cause above. "
                               f"Failed core proc(s): {{'EngineCore': {self.proc.exitcode}}}") from None
        if kind != "ready":
            self._finalizer()
            raise value
        self.engine_pid = value
        self.engine_ranks_managed = [0]

    def _request(self, *message):
        with self._lock:
            if not self.proc.is_alive():
                raise RuntimeError("EngineCore is not running (EngineDeadError)")
            self._conn.send(message)
            kind, value = self._conn.recv()
        if kind == "error":
            raise value
        return value

    def call_utility(self, method: str, *args):
        return self._request("utility", method, args)

    def shutdown(self, timeout: "float | None" = None) -> None:
        self._finalizer()


class AsyncMPClient(MPClient):
    def __init__(self, vllm_config, executor_class, log_stats: bool, client_addresses=None, client_count: int = 1,
                 client_index: int = 0):
        super().__init__(True, vllm_config, executor_class, log_stats, client_addresses)
        self.client_index = client_index

    async def _in_executor(self, *message):
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self._request(*message))

    async def call_utility_async(self, method: str, *args):
        return await self._in_executor("utility", method, args)

    async def generate_async(self, prompts, params, loras):
        return await self._in_executor("generate", prompts, params, loras)

    async def sleep_async(self, level: int = 1, mode: str = "abort") -> None:
        await self.call_utility_async("sleep", level, mode)

    async def wake_up_async(self, tags: "list[str] | None" = None) -> None:
        await self.call_utility_async("wake_up", tags)

    async def is_sleeping_async(self) -> bool:
        return await self.call_utility_async("is_sleeping")

    async def reset_prefix_cache_async(self, reset_running_requests: bool = False,
                                       reset_connector: bool = False) -> bool:
        return await self.call_utility_async("reset_prefix_cache", reset_running_requests, reset_connector)

    async def reset_encoder_cache_async(self) -> None:
        await self.call_utility_async("reset_encoder_cache")

    async def reset_mm_cache_async(self) -> None:
        await self.call_utility_async("reset_mm_cache")

    async def collective_rpc_async(self, method, timeout=None, args=(), kwargs=None):
        return await self.call_utility_async("collective_rpc", method, timeout, args, kwargs)
