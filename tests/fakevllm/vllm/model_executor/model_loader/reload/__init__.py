"""Mirrors vllm/model_executor/model_loader/reload/__init__.py (added in vLLM 0.16.0; absent in
0.15.1): layerwise weight reloading, ``initialize_layerwise_reload`` / ``finalize_layerwise_reload``."""
from vllm import _fake

if _fake.V < _fake.Version("0.16.0"):
    raise ModuleNotFoundError(f"No module named 'vllm.model_executor.model_loader.reload' (vLLM {_fake.VERSION})",
                              name="vllm.model_executor.model_loader.reload")

from vllm.model_executor.model_loader.reload.layerwise import (  # noqa: E402
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

__all__ = ["initialize_layerwise_reload", "finalize_layerwise_reload"]

if _fake.V >= _fake.Version("0.34.0"):  # 0.34 reload/__init__.py exports the lifecycle entry points
    from vllm.model_executor.model_loader.reload.lifecycle import (  # noqa: E402
        finish_reload,
        start_reload,
        weight_update_active,
    )

    __all__ += ["finish_reload", "start_reload", "weight_update_active"]
