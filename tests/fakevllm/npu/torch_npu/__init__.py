"""Hardware stand-in for torch_npu (Ascend): importing it installs ``torch.npu``
with mem_get_info / empty_cache / synchronize / memory._set_allocator_settings
backed by the fake device (vllm._fake.device).  ``torch.npu.is_available()``
stays False so trainers keep running on CPU."""
import sys

import torch
from vllm._fake import device as _device  # noqa: E402

npu = _device.make_npu_namespace()
torch.npu = npu
sys.modules.setdefault("torch.npu", npu)
sys.modules.setdefault("torch_npu.npu", npu)
__version__ = "2.7.1.fake"
