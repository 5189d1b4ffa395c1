# What runpy and importlib.resources need from the shim's hooked loader (test_engine.py
# test_hooked_loader_delegates_everything_runpy_and_resources_need).
import importlib.util
import json
import runpy

import toy_patches

from shim.engine import registry

registry.activate([toy_patches.OK])
spec = importlib.util.find_spec('toyup.core')
loader = spec.loader
ns = runpy.run_module('toyup.core')
print(json.dumps({'loader': type(loader).__name__, 'package': loader.is_package('toyup.core'),
                  'source': 'class Engine' in loader.get_source('toyup.core'),
                  'file': loader.get_filename('toyup.core').endswith('core.py'), 'runpy': 'Engine' in ns}))
