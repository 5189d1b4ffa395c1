"""Stand-in for the vllm-ascend plugin (FAKEVLLM_DEVICE=npu only).

Version: FAKEVLLM_ASCEND_VERSION (default 0.13.0rc1).  NPUWorker has
``reload_weights`` only from 0.24.0rc1, like upstream.
"""

from vllm import _fake

if _fake.DEVICE_TYPE != "npu":
    raise ImportError("fake vllm_ascend is only importable with FAKEVLLM_DEVICE=npu")
import torch_npu  # noqa: E402,F401

__version__ = _fake.ASCEND_VERSION
