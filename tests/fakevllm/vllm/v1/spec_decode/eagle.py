"""Mirrors vllm/v1/spec_decode/eagle.py ``EagleProposer``, the drafter of speculative decoding with
``method`` "eagle", "eagle3" or "mtp" (``SpeculativeConfig.use_eagle``), for what sleep mode does to it.

``GPUModelRunner.__init__`` creates it (``self.drafter``) and ``GPUModelRunner.load_model`` calls
``self.drafter.load_model(self.model)`` after the target model (and LoRA), still inside the worker's
``use_memory_pool(tag="weights")``: the drafter's weights are in the weights tag, so a level-1 sleep copies
them to host memory and the wake restores them, and a level-2 sleep discards them (undefined after the
wake) like the target's -- unless ``sleep_preserve_parameter_names`` names them (``draft.*``, 0.33+:
``Worker._save_sleep_parameters``; 0.34 ``Worker._discardable_parameters`` leaves their allocation offloaded). For MTP, upstream's draft model is the checkpoint's MTP module (DeepSeekMTP,
Qwen3NextMTP: ``enorm``, ``hnorm``, ``eh_proj`` and a decoder block) sharing the target's ``embed_tokens``
and ``lm_head`` (``EagleProposer.load_model`` points them at the target's). The stand-in's tiny checkpoints
have no MTP layer, so those drafter-only weights are initialized once at load from the engine's seed (what
0.9.0's verl calls "MTP drafter-only weights are initialized by vLLM"); no trainer push names them.

The draft model has vLLM's ``load_weights`` (a write while the weights tag is unmapped is lost on CUDA and
faults on NPU, as the target's). ``weights_origin`` is "initialized", "load_weights" or "garbage";
``weights_fp()`` fingerprints the drafter-only weights. Proposing and accepting tokens are not modelled.
"""
from __future__ import annotations

import torch
from torch import nn

from vllm import _fake


class MTPDraftModel(nn.Module):
    """The MTP module's own weights; ``shared`` holds the target's embeddings and head (not owned)."""

    def __init__(self, hidden: int, seed: int):
        super().__init__()
        self.enorm = nn.Parameter(torch.ones(hidden))
        self.hnorm = nn.Parameter(torch.ones(hidden))
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.mtp_block = nn.Linear(hidden, hidden, bias=False)
        g = torch.Generator().manual_seed(0x7A9 + int(seed))
        with torch.no_grad():
            for p in (self.eh_proj.weight, self.mtp_block.weight):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        self.requires_grad_(False)
        self.shared: dict = {}
        self._proposer = None

    def load_weights(self, weights) -> set:
        proposer = self._proposer
        params = dict(self.named_parameters())
        mapped = proposer is None or proposer.weights_alloc is None or proposer.weights_alloc.mapped
        if not mapped and _fake.DEVICE_TYPE == "npu":
            raise RuntimeError("The DDR address of the MTE instruction is out of range")
        loaded = set()
        with torch.no_grad():
            for name, w in weights:
                if name in params:
                    if mapped:
                        params[name].copy_(w.detach().to(params[name].dtype))
                    loaded.add(name)
        if loaded and mapped and proposer is not None:
            proposer.weights_origin = "load_weights"
        _fake.log_event("drafter_load_weights", names=len(loaded), lost=not mapped)
        return loaded


class EagleProposer:
    def __init__(self, vllm_config, device=None, runner=None):
        self.vllm_config = vllm_config
        self.speculative_config = vllm_config.speculative_config
        self.method = self.speculative_config.method
        self.num_speculative_tokens = self.speculative_config.num_speculative_tokens
        self.device = device
        self.runner = runner
        self.model = None
        self.weights_alloc = None
        self.other_alloc = None
        self.weights_origin = None

    def load_model(self, target_model: nn.Module) -> None:
        from vllm.v1.worker.gpu_model_runner import WeightsPayload

        hidden = target_model.get_input_embeddings().weight.shape[1]
        model = MTPDraftModel(hidden, seed=self.vllm_config.model_config.seed or 0)
        model.shared = {"embed_tokens": target_model.get_input_embeddings(),
                        "lm_head": target_model.get_output_embeddings()}
        model._proposer = self
        self.model = model
        from vllm.v1.worker.gpu_model_runner import _allocate_weights

        nbytes = sum(t.numel() * t.element_size() for _, t in WeightsPayload(model).tensors())
        self.weights_alloc, self.other_alloc = _allocate_weights(model, self, "drafter")
        self.weights_origin = "initialized"
        _fake.log_event("load_drafter", method=self.method, nbytes=nbytes, weights_fp=self.weights_fp(),
                        in_pool=self.weights_alloc.pool is not None)

    def weights_fp(self) -> str:
        return _fake.fingerprint(self.model.named_parameters())
