"""Mirrors vllm_ascend/ops/fused_moe/fused_moe.py ``AscendUnquantizedFusedMoEMethod`` (no NZ format, no
fused MC2, no EPLB).

``process_weights_after_loading`` re-lays both fused expert weights for ``torch_npu.npu_grouped_matmul``:
``transpose(1, 2).contiguous()``, so ``w13_weight`` becomes [E, H, 2*I] and ``w2_weight`` [E, I, H]
(the "processed" layout). Up to vllm-ascend 0.25.1rc1 it assigns NEW ``nn.Parameter`` objects (the
loader's ``weight_loader`` attribute is gone); from 0.26.0rc1 (PR #13012) it writes ``.data`` in place
and keeps the Parameter (read in the 0.13.0, 0.23.0, 0.25.1rc1 and 0.26.0rc1 wheels).

``apply_expert`` is the grouped matmul of one expert on the processed layout: ``x @ w13[e]`` then
``@ w2[e]`` with no transpose (``need_trans=False``, the default of the unquantized path). On weights in
any other layout the matmul's inner dimensions do not match and it raises, as the NPU kernel does
(vllm-ascend#11548: "the input shape and the weight shape do not match").
"""
import torch
from packaging.version import Version
from torch import nn
from vllm import _fake
from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod


class AscendUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    def process_weights_after_loading(self, layer) -> None:
        w13 = layer.w13_weight.data.transpose(1, 2).contiguous()
        w2 = layer.w2_weight.data.transpose(1, 2).contiguous()
        if Version(_fake.ASCEND_VERSION) < Version("0.26.0rc1"):
            layer.w13_weight = nn.Parameter(w13, requires_grad=False)
            layer.w2_weight = nn.Parameter(w2, requires_grad=False)
        else:
            layer.w13_weight.data = w13
            layer.w2_weight.data = w2

    def apply_expert(self, layer, expert: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ layer.w13_weight[expert]          # [T, H] @ [H, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        return (nn.functional.silu(gate) * up) @ layer.w2_weight[expert]  # [T, I] @ [I, H]
