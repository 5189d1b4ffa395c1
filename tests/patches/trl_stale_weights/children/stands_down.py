# trl-stale-weights on TRL 1.10.0 (test_contract.py test_stands_down_on_the_fixed_release_by_behaviour): the
# patch's decision and the markers left on VLLMGeneration. sys.argv[1]: what gates it, "range" or "probe" (the
# range widened so that only the probe can stand it down).
import json
import sys

from shim.engine import catalog, registry
from shim.engine.patcher import markers

GATE = sys.argv[1]
entry = next(e for e in catalog.entries() if e.id == "trl-stale-weights")
patch = entry.load()
if GATE == "probe":  # the range alone would let 1.10.0 in: only the probe can stand down
    patch.affected = ">=0.28.0"
registry.activate([entry])
from trl.generation import vllm_generation as m

print(json.dumps({"decision": registry.decisions()[patch.id].text(),
                  "markers": {n: markers(getattr(m.VLLMGeneration, n)) for n in ("generate", "sync_weights")}}))
