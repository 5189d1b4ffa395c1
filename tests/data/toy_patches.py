"""Patches on the toy upstream ``toyup.core`` (version 1.2.0), for the engine tests."""
from shim.engine.patch import Patch


def _generate(wrapped, instance, args, kwargs):
    return "patched:" + wrapped(*args, **kwargs)


def apply_ok(module, patcher):
    patcher.wrap(module.Engine, "generate", _generate)


def apply_boom(module, patcher):
    patcher.wrap(module.Engine, "generate", _generate)  # done first: must be rolled back
    raise RuntimeError("boom inside the patch")


def probe_changed(module):
    return None if hasattr(module.Engine, "no_such_method") else "upstream shape changed: Engine.no_such_method missing"


def make(name="ok", affected=">=1.0,<2.0", apply=apply_ok, probe=None):
    return Patch(id=f"toy-{name}", issue="toy/toyup#1", distribution="toyup", affected=affected,
                 module="toyup.core", apply=apply, probe=probe, summary="toy")


OK = make()
OUT_OF_RANGE = make("old", affected=">=2.0")
PROBE_FAILS = make("probe", probe=probe_changed)
BOOM = make("boom", apply=apply_boom)


def _generate_second(wrapped, instance, args, kwargs):
    return "second:" + wrapped(*args, **kwargs)


def apply_second(module, patcher):
    patcher.wrap(module.Engine, "generate", _generate_second)


LOCK_SEEN = []


def probe_records_lock(module):
    """Records whether the registry lock is held while a probe runs (it must not be)."""
    from shim.engine import registry

    LOCK_SEEN.append(registry._registry.lock._is_owned())
    return None


SECOND = make("second", apply=apply_second)
LOCK_PROBE = make("lock", probe=probe_records_lock)
