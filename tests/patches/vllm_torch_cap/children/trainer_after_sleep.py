# The trainer's process with an in-process engine (TRL / ms-swift colocate): after a sleep the trainer
# allocates more than was free before it (R["trainer"]: "ok" or the OOM); torch's cap (R["limit*"]) read
# from vLLM's extensible KV cache (0.34) at each step: asleep, after a weights-only wake, fully awake, and
# around a KV discard. TEST_USER_CAP: the program caps torch itself (any vLLM). A stand_in body (after
# tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, dev, gen, new_llm, runner

if os.environ.get("TEST_USER_CAP"):
    torch.cuda.set_per_process_memory_fraction(float(os.environ["TEST_USER_CAP"]))
llm = new_llm()
R["first"] = gen(llm)
kv = runner(llm).extensible_kv_cache
limit = (lambda: kv.torch_memory_limit) if kv is not None else (lambda: None)
R["limit"] = limit()


def free():
    return torch.cuda.mem_get_info()[0]


R["free_before"] = free()
llm.sleep(level=1)
R["free_after"] = free()
R["limit_asleep"] = limit()
try:
    blk = dev.allocate(int(R["free_before"] + (R["free_after"] - R["free_before"]) / 2), label="trainer")
    dev.free(blk)
    R["trainer"] = "ok"
except Exception as exc:
    R["trainer"] = f"{type(exc).__name__}: {exc}"
torch.cuda.empty_cache()
llm.wake_up(["weights"])
R["limit_weights_awake"] = limit()
llm.wake_up(["kv_cache"])
R["limit_awake"] = limit()
R["after"] = gen(llm)
if hasattr(llm, "release_kv_cache_memory"):
    llm.sleep(level=0)
    llm.release_kv_cache_memory()
    R["limit_discarded"] = limit()
    llm.wake_up(["kv_cache"])
    R["limit_rewoken"] = limit()
    R["after_discard"] = gen(llm)
