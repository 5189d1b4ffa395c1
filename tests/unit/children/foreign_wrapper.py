# A user's wrapt wrapper over the shim's, then the shim's patch removed (test_engine.py
# test_remove_under_a_foreign_wrapper_keeps_the_foreign_one).
import json

import toy_patches
import toyup.core
import wrapt

from shim.engine import registry
from shim.engine.patcher import markers

registry.activate([toy_patches.OK])
E = toyup.core.Engine
wrapt.wrap_function_wrapper(E, 'generate', lambda w, i, a, k: 'user:' + w(*a, **k))
removed = registry.remove('toy-ok')
print(json.dumps({'removed': removed, 'out': E().generate('x'), 'markers': markers(vars(E)['generate'])}))
