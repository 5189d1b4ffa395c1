# Two patches stacked on one method, removed one after the other (test_engine.py
# test_remove_from_a_stack_of_two_takes_out_only_its_own). sys.argv[1:3]: the id removed first, the other.
import json
import sys

import toy_patches
import toyup.core

from shim.engine import registry
from shim.engine.patcher import markers

first, other = sys.argv[1:3]
registry.activate([toy_patches.OK, toy_patches.SECOND])
E = toyup.core.Engine
before = E().generate('x')
removed = registry.remove(first)
mid = {'out': E().generate('x'), 'markers': markers(vars(E)['generate'])}
registry.remove(other)
print(json.dumps({'before': before, 'removed': removed, 'mid': mid, 'after': E().generate('x'),
                  'plain': type(vars(E)['generate']).__name__,
                  'decisions': {k: d.text() for k, d in registry.decisions().items()}}))
