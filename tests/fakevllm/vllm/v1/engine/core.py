"""Mirrors vllm/v1/engine/core.py ``EngineCore`` and ``EngineCoreProc`` (0.24).

``EngineCore.__init__`` builds the executor (``executor_class(vllm_config)``: with one GPU,
vLLM's ``UniProcExecutor``, whose ``Worker`` lives in THIS process) and sizes the KV cache
(``_initialize_kv_caches``). ``sleep(level, mode)``: pause the scheduler (level >= 1 clears the
prefix cache), then ``model_executor.sleep(level)``; ``wake_up(tags)``: drop "scheduling" from
the tags, ``model_executor.wake_up(tags)``, and resume the scheduler only once the executor is
fully awake (0.24: "Partial wakes intentionally keep the remaining allocations asleep");
``is_sleeping`` = scheduler paused or executor sleeping; ``collective_rpc`` and
``reset_prefix_cache`` go to the executor.

``EngineCoreProc.run_engine_core`` is the target of the engine-core process
(``CoreEngineProcManager`` in vllm/v1/engine/utils.py starts it with ``get_mp_context().Process``,
``name="EngineCore"``). Upstream talks ZMQ (ROUTER/PULL sockets, msgpack, a busy loop that
runs scheduler steps between requests); the stand-in keeps one ``multiprocessing`` Pipe and
handles one request at a time: ``("utility", method, args)`` runs ``getattr(core, method)(*args)``
(upstream's ``EngineCoreRequestType.UTILITY``), ``("generate", prompts, params, loras)`` runs the
requests to completion, ``("shutdown",)`` ends the loop. Replies are ``("ok", result)`` or
``("error", exception)``; the first message is ``("ready", pid)``.

Generation borrows the in-process engine's request code (``LLMEngine.run_requests``): the same
sampling, prefix- and encoder-cache bookkeeping and the ``generate`` event, in this process.
Tokenization happens here too (upstream: in the frontend's ``InputProcessor``).
"""
from __future__ import annotations

import itertools
import os

import torch

from vllm import _fake
from vllm.logger import init_logger
from vllm.v1.engine.llm_engine import LLMEngine

logger = init_logger(__name__)


class EngineCore:
    """Inner loop of vLLM's engine (the stand-in's subset)."""

    def __init__(self, vllm_config, executor_class, log_stats: bool = False, **kwargs):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.log_stats = log_stats
        self.model_executor = executor_class(vllm_config)
        avail = self.model_executor.determine_available_memory()[0]  # _initialize_kv_caches
        self.model_executor.initialize_from_config(avail)
        self._scheduler_paused = False
        self.tokenizer = None
        if not getattr(vllm_config, "skip_tokenizer_init", False):
            from transformers import AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(
                self.model_config.tokenizer, trust_remote_code=self.model_config.trust_remote_code)
        self._generator = torch.Generator().manual_seed(int(self.model_config.seed or 0))
        self._req_counter = itertools.count()
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
        self.encoder_cache_manager = EncoderCacheManager()
        from vllm.utils import gc_utils
        if gc_utils.ENGINE_CORE_FREEZES:  # 0.24.0 core.py:232
            gc_utils.freeze_gc_heap()

    # the in-process engine's request and cache code, on this core's own state
    run_requests = LLMEngine.run_requests
    _reset_caches = LLMEngine._reset_caches
    _core_reset_prefix_cache = LLMEngine._core_reset_prefix_cache
    if hasattr(LLMEngine, "reset_encoder_cache"):  # 0.16+, as the in-process engine
        reset_encoder_cache = LLMEngine.reset_encoder_cache
    if hasattr(LLMEngine, "reset_mm_cache"):
        reset_mm_cache = LLMEngine.reset_mm_cache
    if hasattr(LLMEngine, "release_kv_cache_memory"):  # 0.31+
        release_kv_cache_memory = LLMEngine.release_kv_cache_memory
        _release_kv_cache_memory = LLMEngine._release_kv_cache_memory

    def is_scheduler_paused(self) -> bool:
        return self._scheduler_paused

    def sleep(self, level: int = 1, mode: str = "abort"):
        self._scheduler_paused = True  # pause_scheduler(mode, clear_cache=level >= 1)
        if level < 1:
            _fake.log_event("pause_scheduling", level=level)
            return None
        self._reset_caches()
        self.model_executor.sleep(level)
        return None

    def wake_up(self, tags: list[str] | None = None):
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            self.model_executor.wake_up(tags)
        if not self.model_executor.is_sleeping:  # 0.24: resume only once fully awake
            self._scheduler_paused = False

    def is_sleeping(self) -> bool:
        return self.is_scheduler_paused() or self.model_executor.is_sleeping


    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return self._core_reset_prefix_cache(bool(reset_running_requests))

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.model_executor.collective_rpc(method, timeout, args, kwargs)

    def shutdown(self) -> None:
        self.model_executor.shutdown()
        import gc
        gc.unfreeze()  # 0.24.0 core.py:652-656: the startup heap visible to the collector again


class EngineCoreProc(EngineCore):
    """The engine core in its own process: a request loop over the client's pipe."""

    def __init__(self, vllm_config, executor_class, log_stats: bool, conn=None, **kwargs):
        super().__init__(vllm_config, executor_class, log_stats)
        self.conn = conn

    @staticmethod
    def run_engine_core(*args, dp_rank: int = 0, local_dp_rank: int = 0, **kwargs):
        """Launch the engine core loop in the background process (``name="EngineCore"``)."""
        conn = kwargs["conn"]
        engine_core = None
        try:
            engine_core = EngineCoreProc(*args, **kwargs)
        except BaseException as exc:
            logger.exception("EngineCore failed to start.")
            conn.send(("error", _portable(exc)))
            raise
        conn.send(("ready", os.getpid()))
        try:
            engine_core.run_busy_loop()
        finally:
            engine_core.shutdown()

    def run_busy_loop(self) -> None:
        while True:
            try:
                request = self.conn.recv()
            except EOFError:  # the client went away
                return
            kind = request[0]
            if kind == "shutdown":
                self.conn.send(("ok", None))
                return
            try:
                if kind == "generate":
                    _, prompts, params, loras = request
                    result = self.run_requests([self._tokenize(p) for p in prompts], params, loras)
                else:  # "utility"
                    _, method, call_args = request
                    result = getattr(self, method)(*call_args)
            except Exception as exc:  # upstream returns a utility's failure to the client
                self.conn.send(("error", _portable(exc)))
                continue
            self.conn.send(("ok", result))

    def _tokenize(self, prompt) -> dict:
        if isinstance(prompt, str):
            return {"prompt": prompt, "prompt_token_ids": self.tokenizer(prompt)["input_ids"]}
        if "prompt_token_ids" not in prompt:
            return {"prompt": prompt["prompt"], "prompt_token_ids": self.tokenizer(prompt["prompt"])["input_ids"],
                    "multi_modal_data": prompt.get("multi_modal_data")}
        return dict(prompt)


def _portable(exc: BaseException) -> BaseException:
    """The exception itself where it pickles, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
