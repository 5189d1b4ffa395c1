# One record of patches/swift_level2_resync.py with its version range widened, so that only its probe can
# stand it down (test_swift_rollouts.py probe_alone): the decision and the marker left on the rollout mixin's
# method, printed as JSON. sys.argv[1]: JSON {"record", "affected", "method"}.
import json
import sys

from shim.engine import registry
from shim.engine.catalog import patch_module
from shim.engine.patch import Patch
from shim.engine.patcher import MARKER

spec = json.loads(sys.argv[1])
p = getattr(patch_module("swift_level2_resync"), spec["record"])
# the range widened to include the release: only the probe can stand the patch down now
wide = Patch(id=p.id, issue=p.issue, distribution=p.distribution, affected=spec["affected"],
                      module=p.module, apply=p.apply, probe=p.probe)
registry.activate([wide])
import swift.trainers.rlhf_trainer.rollout_mixin as m

print(json.dumps({"decision": registry.decisions()[p.id].text(),
                  "wrapped_by": getattr(vars(m.RolloutTrainerMixin)[spec["method"]], MARKER, None)}))
