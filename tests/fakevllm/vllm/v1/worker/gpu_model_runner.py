"""Mirrors vllm/v1/worker/gpu_model_runner.py (GPUModelRunner): ``load_model``,
``reload_weights``, ``initialize_kv_cache`` and the forward + sampler of
``execute_model`` (vllm/v1/sample/sampler.py) -- on CPU, with a REAL
transformers model loaded from the engine's checkpoint directory.

The model object is the transformers model itself, given a ``load_weights``
method (vLLM models' ``load_weights(Iterable[tuple[str, Tensor]]) -> set[str]``)
so ``driver_worker.model_runner.model.load_weights(...)`` works as in TRL.
Its parameters and buffers are the payload of the "weights" allocation on the
fake device: while that allocation is unmapped, the contents are undefined.

As vLLM's model loader (``BaseModelLoader.load_model``), ``load_model`` gives every Linear a
``quant_method`` (``UnquantizedLinearMethod``, or ``Fp8LinearMethod`` for a quantized engine:
``quantization=`` / ``FAKEVLLM_QUANTIZATION``) and, after the weights, runs
``model_loader.utils.process_weights_after_loading`` -- which is where DeepSeek-V2/V3 models
(``layers/attention/mla_attention.py``) derive ``W_UK_T`` / ``W_UV``, inside the weights pool (with an
fp8 KV cache, the plain ``Attention`` layers their KV-cache scales: ``layers/attention/attention.py``).
``reload_weights`` follows the version: up to 0.15 a disk reload without post-processing
(``model_loader.load_weights`` only, 0.15.1); from 0.16 ``reload_weights(weights_iterator=None,
weights_path=None, is_checkpoint_format=True)`` through the layerwise reload
(``model_loader/reload``). NPU mode, MLA model: vllm-ascend's module-global rope caches are recorded while
the model is built (``vllm_ascend/ops/rotary_embedding.py``). With ``speculative_config`` (eagle / eagle3 /
mtp) the runner has a ``drafter`` (``vllm/v1/spec_decode/eagle.py``) loaded after the target, in the same
weights tag.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch

from vllm import _fake
from vllm._fake.device import DEVICE
from vllm.logprobs import Logprob
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin


def _device_fault() -> RuntimeError:
    if _fake.DEVICE_TYPE == "npu":
        return RuntimeError("The DDR address of the MTE instruction is out of range")
    return RuntimeError("CUDA error: an illegal memory access was encountered")


def _layerwise():
    """The layerwise-reload module (vLLM 0.16+), or None."""
    if _fake.V < _fake.Version("0.16.0"):
        return None
    from vllm.model_executor.model_loader.reload import layerwise
    return layerwise


def _cache_kw(model) -> str:
    import inspect
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class WeightsPayload:
    """Contents of a "weights" allocation: all parameters and buffers (``part="all"``), or, where the
    0.34 level-2 rule tells allocations apart by what they hold (``Worker.sleep``), the parameters alone
    (``"parameters"``) or everything else: buffers and LoRA slots (``"other"``). Only the part holding
    the parameters carries the runner's ``weights_origin``."""

    def __init__(self, model: torch.nn.Module, runner=None, part: str = "all"):
        self.model = model
        self.runner = runner if part != "other" else None
        self.part = part
        self._garbage_seed = 0

    def tensors(self):
        if self.part != "other":
            yield from self.model.named_parameters()
        if self.part == "parameters":
            return
        yield from self.model.named_buffers()
        for prefix, module in self.model.named_modules():  # LoRA slots (vllm.lora.layers), weights tag too
            if hasattr(module, "named_lora_slots"):
                yield from module.named_lora_slots(prefix)

    def storage_ptrs(self) -> set:
        """Where the tensors it holds start (``discardable_allocations`` compares them with the parameters')."""
        return {t.untyped_storage().data_ptr() for _, t in self.tensors()}

    def backup(self):
        b = {n: t.detach().clone() for n, t in self.tensors()}
        b["__origin__"] = getattr(self.runner, "weights_origin", None)
        return b

    def restore(self, backup):
        if self.runner is not None:
            self.runner.weights_origin = backup.get("__origin__")
        with torch.no_grad():
            for n, t in self.tensors():
                if n in backup:
                    t.copy_(backup[n])

    def scramble(self):
        """Fresh physical pages: undefined contents (finite random values)."""
        self._garbage_seed += 1
        if self.runner is not None:
            self.runner.weights_origin = "garbage"
        g = torch.Generator().manual_seed(0xBAD0 + self._garbage_seed)
        with torch.no_grad():
            for _, t in self.tensors():
                if t.is_floating_point():
                    t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * 2.0)
                else:
                    t.copy_(torch.randint(0, 7, t.shape, generator=g).to(t.dtype))


def _allocate_weights(model: torch.nn.Module, owner, label: str):
    """``(parameters allocation, other allocation or None)`` of ``model`` on the fake device. Up to 0.33 one
    allocation holds the parameters and buffers together (what a sleep treats alike: all offloaded or all
    discarded). From 0.34, whose level-2 sleep discards only the allocations holding nothing but parameters
    (``device_allocator/__init__.py::discardable_allocations``), the parameters have their own allocation
    and the buffers and LoRA slots another (on a GPU large parameters sit in segments of their own; small
    tensors share, which the stand-in does not model)."""
    if _fake.V < _fake.Version("0.34.0"):
        nbytes = sum(t.numel() * t.element_size() for _, t in WeightsPayload(model).tensors())
        return DEVICE.allocate(nbytes, label=label, payload=WeightsPayload(model, owner)), None
    allocs = []
    for part in ("parameters", "other"):
        payload = WeightsPayload(model, owner, part)
        nbytes = sum(t.numel() * t.element_size() for _, t in payload.tensors())
        allocs.append(DEVICE.allocate(nbytes, label=label if part == "parameters" else f"{label}:{part}", payload=payload) if nbytes else None)
    return allocs[0], allocs[1]


class VllmModelMixin:
    """Adds vLLM's model ``load_weights`` to the transformers model."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        runner = self._fake_runner
        return runner._write_weights(weights, source="load_weights")


class GPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config, device=None):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.device = device
        self.model = None
        self.weights_alloc = None
        self.other_alloc = None  # 0.34+: buffers and LoRA slots in an allocation of their own (_allocate_weights)
        self.kv_alloc = None
        self.weights_origin = None
        self.checkpoint_fp = None
        self.prefix_cache: dict[tuple, str] = {}
        self.mla_layers: list = []
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is not None and spec.use_eagle():  # upstream: EagleProposer for eagle / eagle3 / mtp
            from vllm.v1.spec_decode.eagle import EagleProposer
            self.drafter = EagleProposer(vllm_config, device, self)

    # -- loading --------------------------------------------------------------
    def _from_disk(self):
        from transformers import AutoConfig, AutoModelForCausalLM
        mc = self.model_config
        if mc.load_format == "dummy":
            cfg = AutoConfig.from_pretrained(mc.model, trust_remote_code=mc.trust_remote_code)
            return AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        return AutoModelForCausalLM.from_pretrained(mc.model, torch_dtype=torch.float32,
                                                    trust_remote_code=mc.trust_remote_code)

    def load_model(self, eep_scale_up: bool = False) -> None:
        from vllm.model_executor.layers import fused_moe

        hf = self._from_disk()
        fused_moe.convert(hf)  # MoE models: vLLM's fused experts (w13_weight / w2_weight)
        hf.eval()
        hf.requires_grad_(False)
        hf.__class__ = type("Fake" + type(hf).__name__, (type(hf), VllmModelMixin), {})
        hf._fake_runner = self
        self._set_quant_methods(hf)
        from vllm.model_executor.layers.attention import attention, mla_attention
        self.mla_layers = mla_attention.attach(hf)
        attention._attach(hf, self.cache_config.cache_dtype, bool(getattr(self.model_config, "quantization", None)))
        if self.mla_layers and _fake.DEVICE_TYPE == "npu":  # vllm-ascend's rope caches (module globals, MLA path)
            from vllm_ascend.ops import rotary_embedding
            rotary_embedding.attach(hf)
        if self.vllm_config.lora_config is not None:  # load_model: self.load_lora_model(...) under the weights tag
            hf = self.load_lora_model(hf, self.model_config, None, self.vllm_config.lora_config, self.device)
        self.model = hf
        nbytes = sum(t.numel() * t.element_size() for _, t in WeightsPayload(hf).tensors())
        self.weights_alloc, self.other_alloc = _allocate_weights(hf, self, "weights")
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
        process_weights_after_loading(hf, self.model_config, self.device)
        self.checkpoint_fp = self.weights_fp()
        self.weights_origin = "checkpoint"
        if hasattr(self, "drafter"):  # upstream: after the target (and LoRA), in the same weights pool
            self.drafter.load_model(self.model)
        _fake.log_event("load_model", model=str(self.model_config.model), nbytes=nbytes,
                        weights_fp=self.checkpoint_fp, in_pool=self.weights_alloc.pool is not None)

    def _set_quant_methods(self, model) -> None:
        """``LinearBase.__init__``: ``quant_method`` from the quant config (lm_head stays unquantized)."""
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod
        quantized = bool(getattr(self.model_config, "quantization", None))
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not out:
                module.quant_method = Fp8LinearMethod() if quantized else UnquantizedLinearMethod()

    def get_model(self):
        return self.model

    def weights_fp(self) -> str:
        return _fake.fingerprint(self.model.named_parameters())

    def _weights_accessible(self) -> bool:
        return self.weights_alloc is not None and self.weights_alloc.mapped

    def _write_weights(self, weights, source: str) -> set[str]:
        """default_weight_loader over params_dict (vLLM model load_weights); MoE expert tensors through
        the fused parameter's ``weight_loader`` (vllm.model_executor.layers.fused_moe)."""
        from vllm.model_executor.layers import fused_moe

        params_dict = dict(self.model.named_parameters())
        layerwise = _layerwise()
        loaded: set[str] = set()
        names = []
        mapped = self._weights_accessible()
        if not mapped and _fake.DEVICE_TYPE == "npu":
            _fake.log_event(source, lost=True, crashed=True)
            raise _device_fault()
        with torch.no_grad():
            for name, w in weights:
                if name not in params_dict and name == "lm_head.weight" and getattr(
                        self.model.config, "tie_word_embeddings", False):
                    continue
                expert = fused_moe.expert_target(name)
                if expert is not None:  # qwen3_moe load_weights: expert_params_mapping -> param.weight_loader
                    fused_name, shard_id, expert_id = expert
                    param = params_dict[fused_name]
                    if mapped:
                        param.weight_loader(param, w.detach().to(param.device, param.dtype), fused_name,
                                            shard_id=shard_id, expert_id=expert_id)
                    loaded.add(fused_name)
                    names.append(name)
                    continue
                param = params_dict[name]  # KeyError like vLLM for unknown names
                assert param.size() == w.size(), (
                    f"Attempted to load weight ({w.size()}) into parameter ({param.size()})")
                if mapped:
                    param.copy_(w.detach().to(param.device, param.dtype))
                    if layerwise is not None:
                        layerwise.note_loaded(self.model, name, param)
                loaded.add(name)
                names.append(name)
        if mapped:
            fp = self.weights_fp()
            self.weights_origin = "checkpoint" if fp == self.checkpoint_fp else source
        _fake.log_event(source, n_tensors=len(names), lost=not mapped,
                        weights_fp=self.weights_fp() if mapped else None,
                        is_checkpoint=(self.weights_fp() == self.checkpoint_fp) if mapped else None,
                        **({"note": "weights tag unmapped: write lost (undefined behaviour on CUDA)"}
                           if not mapped else {}))
        return loaded

    def _reload_weights_015(self) -> None:
        """Up to 0.15: ``model_loader.load_weights(model)`` from disk; no ``process_weights_after_loading``
        (so MLA's derived matrices are not re-derived; 0.15.1 ``GPUModelRunner.reload_weights``)."""
        fresh = self._from_disk()
        self._write_weights(list(fresh.named_parameters()), source="reload_weights")

    def _reload_weights_016(self, weights_iterator=None, weights_path=None, is_checkpoint_format: bool = True) -> None:
        """0.16+: ``reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True)``;
        without an iterator it re-reads the checkpoint the engine started from. Checkpoint format:
        ``initialize_layerwise_reload`` / ``model.load_weights`` / ``finalize_layerwise_reload``;
        kernel format: a plain copy per parameter. (0.24 then resets the runner's encoder and mm
        caches; the fake keeps those caches in the engine, where ``reset_encoder_cache`` acts.)"""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
        if weights_iterator is None:
            if self.model_config.load_format == "dummy":
                raise NotImplementedError("Model reloading with `dummy` format")
            weights_iterator = list(self._from_disk().named_parameters())
        if is_checkpoint_format:
            initialize_layerwise_reload(self.model)
            self._write_weights(weights_iterator, source="reload_weights")
            finalize_layerwise_reload(self.model, self.model_config)
        else:
            self._write_weights(weights_iterator, source="reload_weights")

    reload_weights = _reload_weights_016 if _fake.V >= _fake.Version("0.16.0") else _reload_weights_015

    def initialize_kv_cache(self, nbytes: int) -> None:
        """0.34 with ``enable_extensible_kv_cache``: the cache is driver-mapped memory outside the pool
        (``v1/worker/extensible_kv_cache.py``), ``self.extensible_kv_cache``."""
        if getattr(self.cache_config, "enable_extensible_kv_cache", False):
            from vllm.v1.worker.extensible_kv_cache import ExtensibleKVCache
            self.extensible_kv_cache = ExtensibleKVCache(nbytes)
            self.kv_alloc = self.extensible_kv_cache.alloc
        else:
            self.kv_alloc = DEVICE.allocate(nbytes, label="kv_cache")
        _fake.log_event("initialize_kv_cache", nbytes=nbytes, in_pool=self.kv_alloc.pool is not None)

    extensible_kv_cache = None

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache.clear()
        return True

    def post_kv_cache_wake_up(self) -> None:
        """``GPUModelRunner.post_kv_cache_wake_up`` (what vllm-ascend 0.26's ``NPUWorker.wake_up`` calls after
        a KV-cache wake): ``init_fp8_kv_scales``, a no-op for an unquantized KV cache such as this one's. Not
        version-gated in the stand-in."""
        return None

    # -- execution ------------------------------------------------------------
    def _decoding(self, on: bool) -> None:
        for layer in self.mla_layers:
            layer.decoding = on

    def check_accessible(self):
        for a in (self.weights_alloc, self.kv_alloc):
            if a is not None and not a.mapped:
                raise _device_fault()

    @torch.no_grad()
    def generate_one(self, prompt_ids: list[int], sp, generator, tokenizer, logprobs_mode: str,
                     eos_ids: set[int]):
        model = self.model
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        out = model(input_ids=ids, use_cache=True)
        past = getattr(out, "past_key_values", None)
        if past is None:
            past = getattr(out, "cache", None)
        logits = out.logits[0, -1].float()
        generated: list[int] = []
        lps = [] if sp.logprobs is not None else None
        cum = 0.0
        finish = "length"
        stop_reason = None
        max_tokens = sp.max_tokens if sp.max_tokens is not None else max(
            self.model_config.max_model_len - len(prompt_ids), 1)
        vocab = logits.shape[-1]
        for step in range(max_tokens):
            raw = logits.clone()
            x = logits.clone()
            if sp.logit_bias:
                for t, b in sp.logit_bias.items():
                    x[int(t)] += b
            if sp.allowed_token_ids:
                mask = torch.full_like(x, float("-inf"))
                mask[list(sp.allowed_token_ids)] = 0
                x = x + mask
            if step < (sp.min_tokens or 0):
                for e in eos_ids | set(sp.stop_token_ids or []):
                    if e < vocab:
                        x[e] = float("-inf")
            seen = prompt_ids + generated
            if sp.repetition_penalty != 1.0 and seen:
                idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
                idx = idx[idx < vocab]
                v = x[idx]
                x[idx] = torch.where(v > 0, v / sp.repetition_penalty, v * sp.repetition_penalty)
            if (sp.presence_penalty or sp.frequency_penalty) and generated:
                cnt = torch.bincount(torch.tensor(generated), minlength=vocab)[:vocab].float()
                x = x - sp.frequency_penalty * cnt - sp.presence_penalty * (cnt > 0).float()
            greedy = sp.temperature < 1e-5
            if not greedy:
                x = x / sp.temperature
                if sp.top_k and sp.top_k > 0 and sp.top_k < vocab:
                    kth = torch.topk(x, sp.top_k).values[-1]
                    x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
                if sp.top_p < 1.0:
                    sx, si = torch.sort(x, descending=True)
                    cp = torch.softmax(sx, -1).cumsum(-1)
                    remove = cp - torch.softmax(sx, -1) > sp.top_p
                    sx[remove] = float("-inf")
                    x = torch.full_like(x, float("-inf")).scatter(0, si, sx)
                if sp.min_p and sp.min_p > 0:
                    p = torch.softmax(x, -1)
                    x = torch.where(p < sp.min_p * p.max(), torch.full_like(x, float("-inf")), x)
                probs = torch.softmax(x, -1)
                tok = int(torch.multinomial(probs, 1, generator=generator).item())
            else:
                tok = int(torch.argmax(x).item())
            src = raw if logprobs_mode.startswith("raw") else x
            lp_all = torch.log_softmax(src, -1)
            tok_lp = float(lp_all[tok])
            cum += tok_lp if not math.isnan(tok_lp) else 0.0
            if lps is not None:
                rank = int((lp_all > lp_all[tok]).sum().item()) + 1
                d = {tok: Logprob(tok_lp, rank, tokenizer.decode([tok]) if tokenizer else None)}
                k = sp.logprobs if sp.logprobs != -1 else vocab
                if k > 0:
                    top = torch.topk(lp_all, min(k, vocab))
                    for r, (v, t) in enumerate(zip(top.values.tolist(), top.indices.tolist()), 1):
                        if t not in d:
                            d[t] = Logprob(v, r, tokenizer.decode([t]) if tokenizer else None)
                lps.append(d)
            generated.append(tok)
            if (tok in eos_ids and not sp.ignore_eos):
                finish = "stop"
                break
            if tok in (sp.stop_token_ids or []):
                finish, stop_reason = "stop", tok
                break
            if sp.stop and tokenizer is not None:
                text = tokenizer.decode(generated, skip_special_tokens=sp.skip_special_tokens)
                hit = next((s for s in sp.stop if s in text), None)
                if hit is not None:
                    finish, stop_reason = "stop", hit
                    break
            if len(prompt_ids) + len(generated) >= self.model_config.max_model_len:
                break
            if self.mla_layers:  # absorbed decode over the latent cache of every token (mla_attention)
                self._decoding(True)
                try:
                    out = model(input_ids=torch.tensor([prompt_ids + generated]), use_cache=False)
                finally:
                    self._decoding(False)
            else:
                out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{_cache_kw(model): past})
                past = getattr(out, "past_key_values", None) or getattr(out, "cache", None)
            logits = out.logits[0, -1].float()
        return generated, lps, cum, finish, stop_reason
