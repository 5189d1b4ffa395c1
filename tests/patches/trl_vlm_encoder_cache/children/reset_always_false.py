# A prefix-cache reset that keeps failing (test_push_caches.py): the engine core never frees the blocks;
# three pushes, each followed by the trainer's reset. A stand_in body (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, new_llm

from vllm.v1.engine.llm_engine import LLMEngine

LLMEngine._core_reset_prefix_cache = lambda self, reset_running_requests=False: False  # blocks never freed
llm = new_llm(enable_sleep_mode=False)
R["results"] = []
try:
    for _ in range(3):  # three pushes, each followed by the trainer's reset
        R["results"].append(llm.reset_prefix_cache())
except RuntimeError as exc:
    R["raised"] = str(exc)
