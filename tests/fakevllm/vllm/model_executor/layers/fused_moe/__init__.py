"""Mirrors vllm/model_executor/layers/fused_moe/layer.py ``FusedMoE`` (unquantized, TP 1, no EP) and
the expert part of vllm/model_executor/models/qwen3_moe.py ``load_weights``.

vLLM keeps the experts of one sparse MoE block in two fused parameters, in checkpoint layout:
``w13_weight`` [E, 2*I, H] (each expert's gate_proj rows, then its up_proj rows) and ``w2_weight``
[E, H, I] (down_proj), each with a ``weight_loader`` that writes one expert's shard
(``shard_id`` "w1" / "w3" / "w2") -- ``load_weights`` calls ``param.weight_loader(...)``, so a
parameter without one cannot be loaded into (AttributeError). After loading, the model loader calls
``quant_method.process_weights_after_loading(layer)``; the forward is ``quant_method.apply``. The
quant method is vLLM's ``UnquantizedFusedMoEMethod`` on CUDA (layout unchanged), and vllm-ascend's
``AscendUnquantizedFusedMoEMethod`` in NPU mode (``vllm_ascend/ops/fused_moe.py`` of the stand-in:
it re-lays the weights for ``npu_grouped_matmul``).

Stand-in specifics: :func:`convert` builds a ``FusedMoE`` from the transformers model's
``experts`` ModuleList (Qwen3-MoE, Qwen2-MoE, Mixtral blocks), with the same values, and puts it in
the list's place; the block's own forward (router, top-k, weighting) runs unchanged and calls
``experts[e](x)``, which computes expert ``e`` through the quant method. Greedy outputs equal the
transformers model's (tests/fakevllm/test_fake.py).
"""
from __future__ import annotations

import torch
from torch import nn

from vllm import _fake


class UnquantizedFusedMoEMethod:
    """vLLM's (CUDA): the checkpoint layout is the compute layout; nothing to process."""

    def process_weights_after_loading(self, layer: "FusedMoE") -> None:
        return None

    def apply_expert(self, layer: "FusedMoE", expert: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ layer.w13_weight[expert].t()           # [T, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        return (nn.functional.silu(gate) * up) @ layer.w2_weight[expert].t()  # [T, H]


def _quant_method():
    if _fake.DEVICE_TYPE == "npu":  # vllm-ascend registers its own MoE method (unquantized path)
        from vllm_ascend.ops.fused_moe import AscendUnquantizedFusedMoEMethod
        return AscendUnquantizedFusedMoEMethod()
    return UnquantizedFusedMoEMethod()


class _Expert:
    def __init__(self, layer: "FusedMoE", expert: int):
        self.layer, self.expert = layer, expert

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.quant_method.apply_expert(self.layer, self.expert, x)


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype=torch.float32):
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.quant_method = _quant_method()
        w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype),
                           requires_grad=False)
        w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype), requires_grad=False)
        self.register_parameter("w13_weight", w13)
        self.register_parameter("w2_weight", w2)
        for p in (w13, w2):  # vLLM: set_weight_attrs(param, {"weight_loader": self.weight_loader})
            p.weight_loader = self.weight_loader

    def __getitem__(self, expert) -> _Expert:  # transformers' block: expert_layer = self.experts[expert_idx]
        return _Expert(self, int(expert))

    def __len__(self) -> int:
        return self.num_experts

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, weight_name: str, shard_id: str,
                      expert_id: int, return_success: bool = False):
        """vLLM's ``FusedMoE.weight_loader`` at TP 1: ``_load_w13`` narrows the expert's rows (dim 0) to
        its half, ``_load_w2`` copies the whole [H, I] matrix; a shape that does not fit raises."""
        expert_data = param.data[expert_id]
        if shard_id in ("w1", "w3"):
            shard_size = expert_data.shape[0] // 2
            start = 0 if shard_id == "w1" else shard_size
            expert_data.narrow(0, start, shard_size).copy_(loaded_weight)
        elif shard_id == "w2":
            expert_data.copy_(loaded_weight)
        else:
            raise ValueError(f"shard_id must be 'w1', 'w2' or 'w3', got {shard_id!r}")
        return True if return_success else None


PROJ_SHARDS = {"gate_proj": ("w13_weight", "w1"), "up_proj": ("w13_weight", "w3"), "down_proj": ("w2_weight", "w2")}


def expert_target(name: str) -> "tuple[str, str, int] | None":
    """``(fused parameter name, shard_id, expert_id)`` of a checkpoint name such as
    ``model.layers.0.mlp.experts.3.gate_proj.weight`` (vLLM's ``make_expert_params_mapping``), else None."""
    parts = name.split(".")
    if len(parts) < 4 or parts[-1] != "weight" or parts[-2] not in PROJ_SHARDS or not parts[-3].isdigit() \
            or parts[-4] != "experts":
        return None
    param, shard = PROJ_SHARDS[parts[-2]]
    return ".".join(parts[:-3] + [param]), shard, int(parts[-3])


def convert(model: nn.Module) -> int:
    """Replace every transformers ``experts`` ModuleList of gated MLPs with a :class:`FusedMoE` holding the
    same values (the layout is processed later, once, by the loader); returns how many."""
    count = 0
    for module in list(model.modules()):
        experts = getattr(module, "experts", None)
        if not isinstance(experts, nn.ModuleList) or not len(experts) or \
                not all(hasattr(e, p) for e in experts for p in PROJ_SHARDS):
            continue
        first = experts[0]
        fused = FusedMoE(len(experts), first.gate_proj.in_features, first.gate_proj.out_features,
                         dtype=first.gate_proj.weight.dtype)
        with torch.no_grad():
            for e, mlp in enumerate(experts):
                fused.weight_loader(fused.w13_weight, mlp.gate_proj.weight, "", "w1", e)
                fused.weight_loader(fused.w13_weight, mlp.up_proj.weight, "", "w3", e)
                fused.weight_loader(fused.w2_weight, mlp.down_proj.weight, "", "w2", e)
        module.experts = fused  # its quant method processes the layout once, in the loader's
        count += 1              # process_weights_after_loading (model_loader/utils.py), as vLLM's does
    return count
