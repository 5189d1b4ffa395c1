"""Mirrors vllm/v1/engine/llm_engine.py ``LLMEngine`` together with the
in-process engine core of vllm/v1/engine/core.py (``EngineCore.sleep``: pause
scheduling, level >= 1 also resets the prefix cache and calls
``model_executor.sleep(level)``; ``wake_up``: "scheduling" tag handling, then
``model_executor.wake_up(tags)`` and resume scheduling; ``is_sleeping`` =
scheduler paused or executor sleeping), plus ``reset_prefix_cache``.

Generation requests run synchronously through the single worker's model runner.
A request made while the scheduler is paused would wait forever in vLLM; the
fake raises instead.  A forward pass touching unmapped memory raises like the
device would (CUDA illegal memory access / NPU MTE out of range).
"""
from __future__ import annotations

import itertools

import torch

from vllm import _fake
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)


class LLMEngine:
    def __init__(self, vllm_config, executor_class=None, log_stats: bool = False, **kwargs):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        executor_class = executor_class or Executor.get_class(vllm_config)
        self.model_executor = executor_class(vllm_config)
        # KV cache sizing (vllm/v1/engine/core.py _initialize_kv_caches)
        avail = self.model_executor.determine_available_memory()[0]
        self.model_executor.initialize_from_config(avail)
        self._scheduler_paused = False
        self.tokenizer = None
        if not getattr(vllm_config, "skip_tokenizer_init", False):
            from transformers import AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(
                self.model_config.tokenizer, trust_remote_code=self.model_config.trust_remote_code)
        seed = self.model_config.seed
        self._generator = torch.Generator().manual_seed(int(seed or 0))
        self._req_counter = itertools.count()
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
        self.encoder_cache_manager = EncoderCacheManager()
        from vllm.utils import gc_utils
        if gc_utils.ENGINE_CORE_FREEZES:  # the in-process engine is its own core: EngineCore.__init__'s freeze
            gc_utils.freeze_gc_heap()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, usage_context=None, stat_loggers=None,
                         enable_multiprocessing: bool = False) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    from_vllm_config = classmethod(lambda cls, vllm_config, **kw: cls(vllm_config))

    # -- tokenizer ------------------------------------------------------------
    def get_tokenizer(self):
        return self.tokenizer

    # -- sleep --------------------------------------------------------------
    def sleep(self, level: int = 1, mode: str = "abort"):
        self._scheduler_paused = True
        if level < 1:
            _fake.log_event("pause_scheduling", level=level)
            return
        self._reset_caches()
        self.model_executor.sleep(level)

    def wake_up(self, tags: list[str] | None = None):
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            self.model_executor.wake_up(tags)
        # resume scheduling (0.18 - 0.2x: unconditionally)
        self._scheduler_paused = False

    def is_sleeping(self) -> bool:
        return self._scheduler_paused or self.model_executor.is_sleeping

    def _release_kv_cache_memory(self) -> None:
        """0.31+ ``EngineCore.release_kv_cache_memory()`` (0.34: ``(reset_connector=True)``): after a completed
        pause (here: ``sleep(level=0)``) with every tag resident, the caches reset and the KV cache
        discarded through ``Executor.discard(("kv_cache",))``; ``wake_up(["kv_cache"])`` brings it back."""
        if not self._scheduler_paused:
            raise RuntimeError("release_kv_cache_memory() requires a completed pause first")
        if self.model_executor.is_sleeping:
            raise RuntimeError("release_kv_cache_memory() requires all executor memory to be resident")
        self._reset_caches()
        self.model_executor.discard(("kv_cache",))

    if _fake.V >= _fake.Version("0.34.0"):
        def release_kv_cache_memory(self, reset_connector: bool = True) -> None:
            self._release_kv_cache_memory()
    elif _fake.V >= _fake.Version("0.31.0"):
        def release_kv_cache_memory(self) -> None:
            self._release_kv_cache_memory()

    def _reset_caches(self) -> None:
        """What ``EngineCore.sleep`` resets (through ``pause_scheduler``), not the public method."""
        if _fake.V >= _fake.Version("0.17.0"):
            self.__dict__.pop("_pending", None)  # mode="abort": in-flight requests aborted
            self._core_reset_prefix_cache(True)
            self.encoder_cache_manager.reset()
            _fake.log_event("reset_encoder_cache", where="sleep")
        else:
            self._core_reset_prefix_cache(True)

    def _core_reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        in_use = len(self.__dict__.get("_pending", ()))
        if in_use and not reset_running_requests:
            logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", in_use)
            _fake.log_event("reset_prefix_cache", ok=False, blocks_in_use=in_use)
            return False
        ok = self.model_executor.reset_prefix_cache()
        _fake.log_event("reset_prefix_cache", ok=ok, preempted=in_use)
        return ok

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False,
                           **kwargs) -> "bool | None":
        if _fake.V < _fake.Version("0.12.0"):  # reset_prefix_cache(device=None): result dropped
            self._core_reset_prefix_cache(False)
            return None
        return self._core_reset_prefix_cache(bool(reset_running_requests))

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.model_executor.collective_rpc(method, timeout, args, kwargs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.__dict__.get("_pending", ()))

    def has_unfinished_requests(self) -> bool:
        return bool(self.__dict__.get("_pending"))

    # -- request API used by ms-swift's VllmEngine (vllm/v1/engine/llm_engine.py add_request/step) ----
    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, **kwargs):
        """Queue one request; ``step()`` runs every queued request to completion (vLLM runs them
        over many steps; ms-swift loops ``step()`` until ``has_unfinished_requests()`` is False)."""
        if isinstance(prompt, str):
            prompt = {"prompt": prompt, "prompt_token_ids": self.tokenizer.encode(prompt)}
        self.__dict__.setdefault("_pending", []).append((str(request_id), prompt, params, lora_request))

    def step(self):
        pending = self.__dict__.pop("_pending", [])
        if not pending:
            return []
        outputs = self.run_requests([p for _, p, _, _ in pending], [s for _, _, s, _ in pending],
                                    [lr for *_, lr in pending])
        for (request_id, *_), out in zip(pending, outputs):
            out.request_id = request_id
        return outputs

    def reset_mm_cache(self) -> None:
        """The multi-modal processor caches (P0/P1: processed inputs, no weights involved)."""
        _fake.log_event("reset_mm_cache")
        return None

    def reset_encoder_cache(self) -> None:
        """``EngineCore.reset_encoder_cache``: scheduler manager + runner storage (0.16+)."""
        self.encoder_cache_manager.reset()
        _fake.log_event("reset_encoder_cache", where="api")
        return None

    def add_lora(self, lora_request) -> bool:
        if self.vllm_config.lora_config is not None:  # EngineCore.add_lora -> model_executor.add_lora (workers)
            return self.model_executor.add_lora(lora_request)
        self.__dict__.setdefault("_loras", {})[lora_request.lora_int_id] = lora_request
        return True

    def list_loras(self) -> set:
        if self.vllm_config.lora_config is not None:
            return self.model_executor.list_loras()
        return set(self.__dict__.get("_loras", {}))

    def abort_request(self, request_ids, internal: bool = False) -> None:
        return None

    # -- generation -------------------------------------------------------------
    def run_requests(self, prompts: list[dict], params: list, lora_requests: list, kind: str = "generate"):
        runner = self.model_executor.driver_worker.model_runner
        if self._scheduler_paused:
            raise RuntimeError(
                "fakevllm: generate() called while the engine is sleeping (scheduler paused, sleeping tags "
                f"{sorted(self.model_executor.sleeping_tags)}); vLLM would never schedule the requests.")
        runner.check_accessible()
        for lr in lora_requests:
            if lr is not None and self.vllm_config.lora_config is None:
                raise ValueError(f"LoRA request {lr!r} but LoRA is not enabled!")
        tok = self.tokenizer
        eos = set()
        if tok is not None and tok.eos_token_id is not None:
            eos.add(tok.eos_token_id)
        gen_cfg_eos = getattr(runner.model.generation_config, "eos_token_id", None)
        if isinstance(gen_cfg_eos, int):
            eos.add(gen_cfg_eos)
        elif gen_cfg_eos:
            eos.update(gen_cfg_eos)
        fp = runner.weights_fp()
        outputs = []
        stale_hits = 0
        n_tokens = 0
        encoder = {"hits": 0, "stale": 0, "computed": 0}
        from vllm.v1.core.encoder_cache_manager import mm_hash, mm_items
        for prompt, sp, lora_request in zip(prompts, params, lora_requests):
            ids = list(prompt["prompt_token_ids"])
            if runner.lora_manager is not None:  # execute_model: set_active_loras (the request's adapter)
                runner.set_active_lora_for_request(lora_request, len(ids))
            rid = str(next(self._req_counter))
            for item in mm_items(prompt.get("multi_modal_data")):
                key = mm_hash(item)
                cached = self.encoder_cache_manager.lookup(rid, key)
                if cached is None:  # the encoder runs with the current weights
                    self.encoder_cache_manager.store(rid, key, fp)
                    encoder["computed"] += 1
                else:
                    encoder["hits"] += 1
                    encoder["stale"] += cached != fp
            if len(ids) >= self.model_config.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                                 f"length of {self.model_config.max_model_len}.")
            if sp.logprobs is not None and sp.logprobs > self.model_config.max_logprobs:
                raise ValueError(f"Requested sample logprobs of {sp.logprobs}, which is greater than "
                                 f"max allowed: {self.model_config.max_logprobs}")
            key = tuple(ids)
            if self.cache_config.enable_prefix_caching:
                if key in runner.prefix_cache and runner.prefix_cache[key] != fp:
                    stale_hits += 1
                runner.prefix_cache.setdefault(key, fp)
            gen = self._generator
            if sp.seed is not None:
                gen = torch.Generator().manual_seed(int(sp.seed))
            comps = []
            for i in range(sp.n):
                toks, lps, cum, finish, stop_reason = runner.generate_one(
                    ids, sp, gen, tok, self.model_config.logprobs_mode, eos)
                n_tokens += len(toks)
                text = tok.decode(toks, skip_special_tokens=sp.skip_special_tokens) if (
                    tok is not None and sp.detokenize) else ""
                comps.append(CompletionOutput(i, text, toks, cum if sp.logprobs is not None else None, lps,
                                              finish, stop_reason))
            self.encoder_cache_manager.free_request(rid)
            outputs.append(RequestOutput(rid, prompt.get("prompt"), ids, None, comps, True,
                                         lora_request=None))
        _fake.log_event(kind, n_prompts=len(prompts), n_completions=sum(len(o.outputs) for o in outputs),
                        n_tokens=n_tokens, weights_fp=fp, is_checkpoint=fp == runner.checkpoint_fp,
                        weights_origin=runner.weights_origin, stale_prefix_hits=stale_hits,
                        encoder_hits=encoder["hits"], stale_encoder_hits=encoder["stale"],
                        encoder_computed=encoder["computed"],
                        in_pool=runner.weights_alloc.pool is not None)
        return outputs


if _fake.V < _fake.Version("0.16.0"):  # added in 0.16.0 (absent in 0.14.0)
    del LLMEngine.reset_encoder_cache

