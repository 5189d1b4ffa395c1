# vLLM 0.33 / 0.34 level 2 with an MTP drafter (test_fake.py test_level2_033_034): what comes back after
# sleep(level=2) + wake_up(), with sleep_preserve_parameter_names from TEST_PRESERVE (comma list, or unset).
# A body that runs after children/prelude.py.
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, model, new_llm, wfp

kw = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
if os.environ.get("TEST_PRESERVE"):
    kw["sleep_preserve_parameter_names"] = os.environ["TEST_PRESERVE"].split(",")
llm = new_llm(**kw)
worker = llm.llm_engine.model_executor.driver_worker
drafter = worker.model_runner.drafter
draft_fp, target_fp = drafter.weights_fp(), wfp(llm)
buffers = {n: b.clone() for n, b in model(llm).named_buffers()}
llm.sleep(level=2)
llm.wake_up()
RESULT["draft_kept"] = drafter.weights_fp() == draft_fp
RESULT["target_kept"] = wfp(llm) == target_fp
RESULT["buffers_kept"] = all(torch.equal(b, buffers[n]) for n, b in model(llm).named_buffers())
RESULT["saved_buffers_attr"] = hasattr(worker, "_sleep_saved_buffers")
RESULT["discardable_method"] = hasattr(worker, "_discardable_parameters")
