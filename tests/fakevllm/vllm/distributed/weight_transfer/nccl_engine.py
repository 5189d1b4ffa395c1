"""Mirrors vllm/distributed/weight_transfer/nccl_engine.py (names only)."""
from dataclasses import dataclass
from typing import Any


@dataclass
class NCCLTrainerSendWeightsArgs:
    group: Any = None
    src: int = 0
    packed: bool = False


class NCCLWeightTransferEngine:
    def __init__(self, *a, **k):
        raise NotImplementedError("fakevllm: NCCL weight transfer is not simulated")
