# SHIM_STRICT=1 and a patch that fails while activated before the import (test_engine.py
# test_strict_failure_before_activation_raises_after_every_patch_is_registered).
import json

import toy_patches
import toyup.core

import shim  # noqa: F401
from shim.engine import registry
from shim.engine.patch import PatchFailed

try:
    registry.activate([toy_patches.BOOM, toy_patches.OK])
except PatchFailed as exc:
    raised = str(exc)
print(json.dumps({'raised': raised, 'again': registry.activate([toy_patches.BOOM, toy_patches.OK]),
                  'decisions': {k: d.text() for k, d in registry.decisions().items()},
                  'out': toyup.core.Engine().generate('x')}))
