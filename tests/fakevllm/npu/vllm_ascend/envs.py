"""Mirrors vllm_ascend/envs.py (the variables the stand-in reads), evaluated at each access as there
(module ``__getattr__`` over ``env_variables``)."""
import os

env_variables = {
    # 0: weight NZ format off; the default 1 turns it on for quantized weights (what RL users set to 0:
    # NPUWorker.wake_up refuses to run with it on)
    "VLLM_ASCEND_ENABLE_NZ": lambda: int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1)),
}


def __getattr__(name: str):
    if name in env_variables:
        return env_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
