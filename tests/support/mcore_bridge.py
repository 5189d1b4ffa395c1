"""A names-only stand-in for ``mcore_bridge`` (ms-swift 4.x's Megatron extra): the real one hard-imports
transformer_engine, which has no CPU build. ``swift.megatron`` imports these names; none is called on
the paths the tests drive. :class:`HFLayoutBridge` is the one part that runs: a trainer's ``bridge`` for a
model already in HF layout."""
import sys
import types


def install() -> None:
    mb = types.ModuleType("mcore_bridge")
    mb.__path__ = []
    mb.__version__ = "0+cpu-standin"

    def unavailable(*args, **kwargs):
        raise RuntimeError("mcore_bridge stand-in: the real one needs transformer_engine")

    for name in ("get_mcore_model", "hf_to_mcore_config", "set_random_seed", "split_cp_inputs", "unwrap_model"):
        setattr(mb, name, unavailable)
    for name in ("ModelConfig", "GPTBridge", "LoraParallelLinear"):
        setattr(mb, name, type(name, (), {}))
    model = types.ModuleType("mcore_bridge.model")  # swift.megatron.arguments (the trainers' modules import it)
    for name in ("get_mcore_model_type", "get_model_meta"):
        setattr(model, name, unavailable)
    mb.model = model
    sys.modules["mcore_bridge"] = mb
    sys.modules["mcore_bridge.model"] = model


class HFLayoutBridge:
    """``GPTBridge.export_weights`` (mcore-bridge 1.6.5 ``bridge/gpt_bridge.py``) for models whose weights
    are already in HF (safetensors) layout: it yields ``(hf_name, tensor)`` for every weight of every model
    chunk, under ``torch.no_grad()``, moved to ``target_device`` when one is given. The real bridge converts
    Megatron's fused, TP-sharded parameters into those names and tensors; for a model built from the HF
    classes the conversion is the identity, so what ms-swift then pushes into vLLM (``load_weights``) is
    what the real bridge would yield. Full weights only (``peft_format`` is not supported)."""

    def export_weights(self, mg_models, target_device=None, only_master_rank=False, peft_format=False,
                       adapter_name="default", converter=None, **kwargs):
        import torch

        if peft_format:
            raise NotImplementedError("HFLayoutBridge: full weights only")
        with torch.no_grad():
            for model in mg_models:
                for name, tensor in model.state_dict().items():
                    if target_device is not None:
                        tensor = tensor.to(target_device)
                    if converter is not None:
                        kv = converter(name, tensor)
                        if kv is None:
                            continue
                        name, tensor = kv
                    yield name, tensor
