"""Mirrors vllm/v1/engine/async_llm.py ``AsyncLLM`` (0.24), the engine that verl, OpenRLHF and
``vllm serve`` drive: the frontend in this process, the engine core (scheduler, executor, the
``Worker`` and therefore the device memory and the sleep pool) in a background process started by
``EngineCoreClient.make_async_mp_client`` (vllm/v1/engine/core_client.py).

``from_engine_args`` / ``from_vllm_config`` build it with ``Executor.get_class(vllm_config)``.
``generate(prompt, sampling_params, request_id, *, lora_request=None)`` is an async generator of
``RequestOutput`` (upstream streams deltas; the stand-in yields the finished output once).
``sleep(level, mode)``, ``wake_up(tags)``, ``is_sleeping()``, ``collective_rpc(method, timeout,
args, kwargs)``, ``reset_prefix_cache(reset_running_requests, reset_connector)``, ``reset_encoder_cache()``, ``reset_mm_cache()`` are
coroutines that
forward to the engine core (``*_async`` utility calls). ``shutdown()`` stops the engine-core process.
``reset_encoder_cache`` exists from 0.16 (vllm#33452, with ``LLMEngine.reset_encoder_cache``: the engine core
then resets the scheduler's ``EncoderCacheManager`` and the runner's storage); an older ``AsyncLLM`` has none
(verl 0.7.1's ``sleep`` keeps the call commented out, 0.8.0's ``_sleep_hybrid`` makes it from vLLM 0.17).
"""
from __future__ import annotations

from vllm import _fake
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)


class AsyncLLM:
    def __init__(self, vllm_config, executor_class, log_stats: bool, usage_context=None, mm_registry=None,
                 log_requests: bool = True, start_engine_loop: bool = True, stat_loggers=None,
                 aggregate_engine_logging: bool = False, client_addresses=None, client_count: int = 1,
                 client_index: int = 0):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.log_requests = log_requests
        self.log_stats = log_stats
        self.engine_core = EngineCoreClient.make_async_mp_client(
            vllm_config=vllm_config, executor_class=executor_class, log_stats=self.log_stats,
            client_addresses=client_addresses, client_count=client_count, client_index=client_index)

    @classmethod
    def from_vllm_config(cls, vllm_config, start_engine_loop: bool = True, usage_context=None, stat_loggers=None,
                         enable_log_requests: bool = False, aggregate_engine_logging: bool = False,
                         disable_log_stats: bool = False, client_addresses=None, client_count: int = 1,
                         client_index: int = 0) -> "AsyncLLM":
        return cls(vllm_config=vllm_config, executor_class=Executor.get_class(vllm_config),
                   start_engine_loop=start_engine_loop, stat_loggers=stat_loggers, log_requests=enable_log_requests,
                   log_stats=not disable_log_stats, usage_context=usage_context, client_addresses=client_addresses,
                   client_count=client_count, client_index=client_index)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, start_engine_loop: bool = True, usage_context=None,
                         stat_loggers=None) -> "AsyncLLM":
        vllm_config = engine_args.create_engine_config()
        return cls(vllm_config=vllm_config, executor_class=Executor.get_class(vllm_config),
                   log_requests=False, log_stats=not engine_args.disable_log_stats,
                   start_engine_loop=start_engine_loop, usage_context=usage_context, stat_loggers=stat_loggers)

    def __del__(self):
        self.shutdown()

    def shutdown(self, timeout: "float | None" = None) -> None:
        engine_core = self.__dict__.get("engine_core")
        if engine_core is not None:
            engine_core.shutdown(timeout=timeout)

    async def generate(self, prompt, sampling_params, request_id: str, *, prompt_text=None, lora_request=None,
                       tokenization_kwargs=None, trace_headers=None, priority: int = 0, data_parallel_rank=None,
                       **kwargs):
        outputs = await self.engine_core.generate_async([prompt], [sampling_params], [lora_request])
        for out in outputs:
            out.request_id = request_id
            yield out

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return await self.engine_core.reset_prefix_cache_async(reset_running_requests, reset_connector)

    async def reset_encoder_cache(self) -> None:
        await self.engine_core.reset_encoder_cache_async()

    async def reset_mm_cache(self) -> None:
        await self.engine_core.reset_mm_cache_async()

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        await self.engine_core.sleep_async(level, mode)

    async def wake_up(self, tags: "list[str] | None" = None) -> None:
        await self.engine_core.wake_up_async(tags)

    # 0.31+: the engine core discards its KV cache (``EngineCore.release_kv_cache_memory``)
    if _fake.V >= _fake.Version("0.34.0"):
        async def release_kv_cache_memory(self, reset_connector: bool = True) -> None:
            await self.engine_core.call_utility_async("release_kv_cache_memory", reset_connector)
    elif _fake.V >= _fake.Version("0.31.0"):
        async def release_kv_cache_memory(self) -> None:
            await self.engine_core.call_utility_async("release_kv_cache_memory")

    async def is_sleeping(self) -> bool:
        return await self.engine_core.is_sleeping_async()

    async def collective_rpc(self, method, timeout: "float | None" = None, args: tuple = (),
                             kwargs: "dict | None" = None):
        return await self.engine_core.collective_rpc_async(method, timeout, args, kwargs)


if _fake.V < _fake.Version("0.16.0"):  # added in 0.16.0, as LLMEngine.reset_encoder_cache
    del AsyncLLM.reset_encoder_cache
