"""CPU stand-in for the ``vllm`` package (vllm-sleep-shim test suite).

Mirrors the public surface of vllm/__init__.py (LLM, SamplingParams,
RequestOutput, CompletionOutput, EngineArgs, LLMEngine ...).  Configured by
FAKEVLLM_* environment variables read at import: see tests/fakevllm/README.md.
"""
from vllm import _fake
from vllm._fake import device as _device

_device.install()

__version__ = _fake.VERSION
__version_tuple__ = tuple(int(x) if x.isdigit() else x for x in __version__.split("."))

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # noqa: E402
from vllm.entrypoints.llm import LLM  # noqa: E402
from vllm.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput  # noqa: E402
from vllm.pooling_params import PoolingParams  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402


def __getattr__(name):
    """``vllm.AsyncLLMEngine``, resolved lazily as upstream's ``MODULE_ATTRS`` does (vllm/__init__.py:
    ``".engine.async_llm_engine:AsyncLLMEngine"``), which on V1 is ``AsyncLLM`` (OpenRLHF, ms-swift's async path)."""
    if name == "AsyncLLMEngine":
        from vllm.engine.async_llm_engine import AsyncLLMEngine

        return AsyncLLMEngine
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineArgs",
           "AsyncEngineArgs", "AsyncLLMEngine", "LLMEngine", "PoolingParams", "PoolingRequestOutput", "__version__"]
