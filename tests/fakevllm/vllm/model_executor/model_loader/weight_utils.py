"""Mirrors vllm/model_executor/model_loader/weight_utils.py (DisabledTqdm, default_weight_loader)."""
from tqdm import tqdm


class DisabledTqdm(tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def default_weight_loader(param, loaded_weight) -> None:
    assert param.size() == loaded_weight.size(), (
        f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
    param.data.copy_(loaded_weight)
