# test_fake.py test_dist_info_version: a body that runs after children/prelude.py (the imports are what
# the test checks: each name exists in the stand-in).
import importlib.metadata as md
import importlib.util
from typing import TYPE_CHECKING

import torch
import vllm
from vllm.distributed.parallel_state import get_world_group  # noqa: F401
from vllm.logprobs import Logprob  # noqa: F401
from vllm.lora.request import LoRARequest  # noqa: F401
from vllm.platforms import current_platform
from vllm.sampling_params import StructuredOutputsParams  # noqa: F401
from vllm.sequence import Logprob as L2  # noqa: F401

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT

RESULT["v"] = md.version("vllm"); RESULT["attr"] = vllm.__version__
RESULT["ascend"] = importlib.util.find_spec("vllm_ascend") is not None
RESULT["dt"] = current_platform.device_type
RESULT["cuda_avail"] = torch.cuda.is_available()
