"""Mirrors vllm/entrypoints/llm.py ``LLM``: constructor (EngineArgs keywords),
``generate``, ``chat``, ``sleep(level, mode)``, ``wake_up(tags)``,
``collective_rpc(method, timeout, args, kwargs)``, ``reset_prefix_cache``,
``reset_mm_cache`` (0.12+; no ``reset_encoder_cache`` on ``LLM`` up to 0.31: it is
``llm.llm_engine.reset_encoder_cache``), ``get_tokenizer``.  (``LLM`` has no ``is_sleeping``; use
``llm.llm_engine.is_sleeping()``.)

Prompts accepted by ``generate``: str, ``{"prompt": str}``,
``{"prompt_token_ids": [...]}`` (TokensPrompt), optionally with
``multi_modal_data`` (each item goes through the encoder cache,
``vllm.v1.core.encoder_cache_manager``; the text-only fake model ignores the
embedding itself), or a list of these.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm import _fake
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

logger = init_logger(__name__)


class LLM:
    def __init__(self, model: str, *, tokenizer: str | None = None, **kwargs: Any):
        _fake.device.DEVICE.ensure_init()
        engine_args = EngineArgs(model=str(model), tokenizer=tokenizer, **kwargs)
        self.engine_args = engine_args
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self.engine_class = type(self.llm_engine)
        self.default_sampling_params = None
        _fake.log_event("llm_init", model=str(model), enable_sleep_mode=engine_args.enable_sleep_mode,
                        gpu_memory_utilization=engine_args.gpu_memory_utilization,
                        backend=engine_args.distributed_executor_backend, version=_fake.VERSION,
                        device=_fake.DEVICE_TYPE, torch_mode=_fake.TORCH_MODE)

    # -- tokenizer ------------------------------------------------------------
    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    # -- prompts --------------------------------------------------------------
    def _to_prompt(self, p) -> dict:
        tok = self.get_tokenizer()
        if isinstance(p, str):
            return {"prompt": p, "prompt_token_ids": tok(p)["input_ids"]}
        if isinstance(p, dict):
            if "prompt_token_ids" in p:
                return {"prompt": p.get("prompt"), "prompt_token_ids": list(p["prompt_token_ids"]),
                        "multi_modal_data": p.get("multi_modal_data")}
            if "prompt" in p:
                return {"prompt": p["prompt"], "prompt_token_ids": tok(p["prompt"])["input_ids"],
                        "multi_modal_data": p.get("multi_modal_data")}
        raise TypeError(f"fakevllm: unsupported prompt type {type(p).__name__}: {p!r}")

    @staticmethod
    def _seq(x, n, what):
        if isinstance(x, Sequence) and not isinstance(x, (str, dict)):
            if len(x) != n:
                raise ValueError(f"The lengths of prompts ({n}) and {what} ({len(x)}) must be the same.")
            return list(x)
        return [x] * n

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None,
                 priority=None, tokenization_kwargs=None, prompt_token_ids=None, **kwargs):
        if prompt_token_ids is not None:  # legacy keyword
            prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = [self._to_prompt(p) for p in prompts]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = self._seq(sampling_params, len(prompts), "params")
        loras = self._seq(lora_request, len(prompts), "lora_request")
        return self.llm_engine.run_requests(prompts, params, loras, kind="generate")

    def chat(self, messages, sampling_params=None, use_tqdm=True, lora_request=None,
             chat_template: str | None = None, chat_template_content_format: str = "auto",
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list | None = None, chat_template_kwargs: dict | None = None,
             mm_processor_kwargs: dict | None = None, **kwargs):
        tok = self.get_tokenizer()
        convs = [messages] if (messages and isinstance(messages[0], dict)) else list(messages)
        prompts = []
        for conv in convs:
            text = tok.apply_chat_template(conv, tokenize=False, chat_template=chat_template, tools=tools,
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message,
                                           **(chat_template_kwargs or {}))
            prompts.append({"prompt": text,
                            "prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]})
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = self._seq(sampling_params, len(prompts), "params")
        loras = self._seq(lora_request, len(prompts), "lora_request")
        return self.llm_engine.run_requests(prompts, params, loras, kind="chat")

    # -- control --------------------------------------------------------------
    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None) -> list:
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func):
        return self.collective_rpc(lambda self_: func(self_.get_model()))

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False):
        return self.llm_engine.reset_prefix_cache(reset_running_requests)

    def reset_mm_cache(self) -> None:
        """0.12+ (``renderer.clear_mm_cache()`` + ``llm_engine.reset_mm_cache()``)."""
        self.llm_engine.reset_mm_cache()

    def sleep(self, level: int = 1, mode: str = "abort"):
        if _fake.V < _fake.Version("0.10.0"):
            self.reset_prefix_cache()
        self.llm_engine.sleep(level=level, mode=mode)

    def wake_up(self, tags: list[str] | None = None):
        self.llm_engine.wake_up(tags)

    # 0.31+ ``LLM.release_kv_cache_memory``: the engine's KV cache discarded without a sleep
    if _fake.V >= _fake.Version("0.34.0"):
        def release_kv_cache_memory(self, reset_connector: bool = True) -> None:
            self.llm_engine.release_kv_cache_memory(reset_connector)
    elif _fake.V >= _fake.Version("0.31.0"):
        def release_kv_cache_memory(self) -> None:
            self.llm_engine.release_kv_cache_memory()

    def start_profile(self, *a, **k):
        return None

    def stop_profile(self):
        return None


if _fake.V < _fake.Version("0.12.0"):
    del LLM.reset_mm_cache
