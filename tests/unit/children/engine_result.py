# The end of every test_engine.py case (run): the toy engine's output after the case's own lines, the
# registry's decisions and what wraps Engine.generate, printed as JSON.
import json

from shim.engine import registry
from shim.engine.patch import PatchFailed  # noqa: F401  (for the case's lines before)
from shim.engine.patcher import markers  # noqa: F401  (for the case's lines before)

# last, as the inline program had it: the import the lazy hooks wait for
# isort: split
import toyup.core as core

e = core.Engine()
print(json.dumps({"out": e.generate("x"), "decisions": {k: d.text() for k, d in registry.decisions().items()},
                  "wrapped": type(vars(core.Engine)["generate"]).__name__}))
