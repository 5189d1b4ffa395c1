"""Mirrors vllm/model_executor/model_loader/reload/lifecycle.py (vLLM 0.34): ``start_reload`` /
``finish_reload`` around a checkpoint-format weight update, and the process-wide ``weight_update_active()``
some models' ``load_weights`` read (a call may hold only part of the checkpoint). ``VLLM_RELOAD_MODE=direct``
is not modelled: the layerwise reload runs."""
from vllm import _fake
from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload, initialize_layerwise_reload

if _fake.V < _fake.Version("0.34.0"):
    raise ModuleNotFoundError(f"No module named 'vllm.model_executor.model_loader.reload.lifecycle' (vLLM {_fake.VERSION})",
                              name="vllm.model_executor.model_loader.reload.lifecycle")


_weight_update_active = False


def weight_update_active() -> bool:
    return _weight_update_active


def start_reload(model) -> None:
    global _weight_update_active
    initialize_layerwise_reload(model)
    _weight_update_active = True


def finish_reload(model, model_config, device) -> None:
    global _weight_update_active
    _weight_update_active = False
    finalize_layerwise_reload(model, model_config)
