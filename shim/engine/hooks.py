"""Post-import hooks: run a callback when a named module has been imported.

Same design as wrapt's ``register_post_import_hook`` (a ``sys.meta_path``
finder that chains the real loader and calls the hooks after the module body
ran), written out here because importing ``wrapt`` 2.x costs ~60 ms at
interpreter start (it imports asyncio and importlib.metadata), which would put
every ``python`` a user starts over the 20 ms start-up budget. wrapt is still
what wraps functions, imported only when a patch applies -- i.e. when the
heavy upstream module is being imported anyway.
"""
from __future__ import annotations

TYPE_CHECKING = False  # not ``from typing import TYPE_CHECKING``: typing (and re, collections) at start-up
if TYPE_CHECKING:  # annotations only; type checkers read the name as True
    from types import ModuleType
    from typing import Callable

import _thread
import sys

_lock = _thread.RLock()  # ``_thread``, not ``threading``/``typing``: start-up pays for every import
_hooks: dict = {}
_busy: set = set()
_finder = None


def register(name: str, hook: "Callable[[ModuleType], None]") -> None:
    """Call ``hook(module)`` once ``name`` is imported (at once if it already is)."""
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
            return
    hook(module)


def _fire(name: str, module: "ModuleType") -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


class _Loader:
    """Runs the real loader, puts it back on the module, then fires the hooks.

    Every other attribute (``get_code``, ``is_package``, ``get_resource_reader``,
    ``get_filename``, ...) is the wrapped loader's, as wrapt's
    ``_ImportHookChainedLoader`` does: ``runpy`` and ``importlib.resources`` ask
    the spec's loader for them before the module is imported."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.__dict__["loader"], name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
        try:
            module.__loader__ = self.loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.loader
        except AttributeError:
            pass
        self.loader.exec_module(module)
        _fire(module.__name__, sys.modules.get(module.__name__, module))


class _Finder:
    """A meta-path finder that only acts for names with pending hooks."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks or fullname in _busy:
            return None
        _busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec

    def invalidate_caches(self) -> None:
        pass
