"""A names-only stand-in for ``mcore_bridge`` (ms-swift 4.x's Megatron extra): the real one hard-imports
transformer_engine, which has no CPU build. ``swift.megatron`` imports these names; none is called on
the paths the tests drive."""
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
    sys.modules["mcore_bridge"] = mb
