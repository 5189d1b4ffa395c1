"""The ``Patcher``: every change a patch makes goes through it, so a failure half-way rolls back and
``remove`` undoes exactly the patch's own layers (also from under wrappers put on top later).

Every wrapper the shim installs carries :data:`MARKER` (its patch id); :func:`markers` lists the
shim's layers on an attribute. :data:`acted` counts, per patch, the calls its wrappers took in this
process (what ``status`` shows as ``applied, acted N times``).
"""
from __future__ import annotations

MARKER = "_self_shim_patch"
"""Attribute on every wrapper the shim installs: the id of its patch (wrapt keeps
``_self_*`` attributes on the proxy, not on the wrapped function)."""

acted: dict = {}
"""patch id -> calls its wrappers took in this process (a plain dict: one increment per call)."""


def _chain(value):
    """``value`` and everything below it through ``__wrapped__`` (wrapt proxies, functools.wraps)."""
    seen = 0
    while value is not None and seen < 64:
        yield value
        value = getattr(value, "__wrapped__", None)
        seen += 1


def _own_marker(value):
    """The patch id on ``value`` itself. A wrapt proxy forwards unknown attributes to what it
    wraps, so a foreign proxy on top of ours would seem to carry our marker: a marker equal to
    the one below is inherited, not its own (one patch never wraps one attribute twice)."""
    marker = getattr(value, MARKER, None)
    if marker is None:
        return None
    inner = getattr(value, "__wrapped__", None)
    return None if inner is not None and getattr(inner, MARKER, None) == marker else marker


def markers(value) -> list:
    """Patch ids of the shim's wrappers stacked on ``value``, outermost first."""
    return [m for m in (_own_marker(v) for v in _chain(value)) if m is not None]


def _is_ours(value, patch_id: str) -> bool:
    return _own_marker(value) == patch_id


class Patcher:
    """Records every change a patch makes so it can be undone, exactly, in reverse order."""

    def __init__(self, patch_id: str):
        self.patch_id = patch_id
        self._undo: list = []
        self.changes: list = []
        """``(owner, name, before)`` of every attribute this patch changed, in order; ``before`` is
        the owner's own value before (``patching.MISSING`` where it had none)."""
        self.leftovers: list = []
        """What :meth:`undo` could not take out (someone else wrapped on top in a way that cannot be re-pointed)."""

    def wrap(self, owner, name: str, wrapper):
        """Put ``wrapt.FunctionWrapper(original, wrapper)`` at ``owner.name``.

        ``owner`` is a class or a module. A name this patch already wraps (anywhere
        in the stack of wrappers) is left alone: wrapt itself does not prevent
        double wrapping.
        """
        import inspect

        import wrapt

        current = getattr(owner, name)
        for layer in _chain(current):
            if _is_ours(layer, self.patch_id):
                return current
        own = vars(owner).get(name, _MISSING)
        patch_id = self.patch_id

        def counted(wrapped, instance, args, kwargs):
            acted[patch_id] = acted.get(patch_id, 0) + 1
            return wrapper(wrapped, instance, args, kwargs)

        target = current if own is _MISSING else own
        if isinstance(owner, type) and inspect.isfunction(target):
            proxy = _method_wrapper_type()(target, counted)
            proxy._self_shim_site = (owner, name)
            proxy._self_shim_unbound = None  # its own: a proxy forwards a missing attribute to the wrapper below
        else:
            proxy = wrapt.FunctionWrapper(target, counted)
        setattr(proxy, MARKER, self.patch_id)
        setattr(owner, name, proxy)
        self.changes.append((owner, name, own))
        # below our layer: what it wraps (the inherited attribute where the owner had none of its own)
        # what our layer wraps now (a stacked patch removed below us re-points it), or nothing of
        # the owner's own where it had none (the inherited attribute shows through again)
        self._undo.append(lambda: self._take_out(owner, name, proxy, _MISSING if own is _MISSING else proxy.__wrapped__,
                                                 proxy.__wrapped__))
        return proxy

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.name = value``; undo puts the old one back (or deletes it), also from under
        wrappers put on top later, and leaves a later replacement alone."""
        own = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)
        self.changes.append((owner, name, own))
        self._undo.append(lambda: self._take_out(owner, name, value, own, own))

    def _take_out(self, owner, name: str, ours, own, below) -> None:
        """Take our layer ``ours`` out of the stack at ``owner.name``, wherever it is now.

        On top: the owner gets ``own`` back (deleted where that is MISSING).
        Under another wrapper: that wrapper is re-pointed to ``below``. Gone (replaced by someone
        else): nothing of ours is left there, nothing to do."""
        top = vars(owner).get(name, _MISSING)
        if top is ours:
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
            return
        parent = None
        for layer in _chain(None if top is _MISSING else top):
            if layer is ours:
                break
            parent = layer
        else:
            return
        where = f"{getattr(owner, '__name__', owner)}.{name}"
        if below is _MISSING:
            self.leftovers.append(where)
            return
        try:
            parent.__wrapped__ = below  # a wrapt proxy re-points: our layer drops out
        except (AttributeError, TypeError):
            self.leftovers.append(where)
            return
        if parent.__wrapped__ is not below:
            self.leftovers.append(where)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


_MISSING = MISSING = object()


_METHOD_WRAPPER: list = []


def _method_wrapper_type():
    """The ``wrapt.FunctionWrapper`` the shim puts on a class's method: one that travels by name when pickled.

    Ray makes an actor class at ``ray.remote(cls)`` (``ray/actor.py`` ``_make_actor``: ``_modify_class``, then
    ``ray/util/tracing/tracing_helper.py`` ``_inject_tracing_into_class``) by reading every method off the class
    (``inspect.getmembers``) and closing a tracing wrapper over what it read; the class then goes to the actor's
    process through Ray's cloudpickle, by value. cloudpickle takes a wrapt proxy for the function it proxies
    (``__class__``, ``__code__``, ``__globals__`` are the wrapped function's) and, as the class attribute is a new
    bound proxy at every lookup (not the object it is pickling), pickles that function's code by value: the actor
    runs a bare copy of the upstream method and never the shim's wrapper, although the shim applied there too
    (verl 0.9.1's ``vLLMHttpServer`` with Ray 2.60 on an H200; the same code in Ray 2.49, reproduced on CPU).

    Here the proxy a class lookup gives is one object per wrapper (while it wraps the same thing), so cloudpickle
    finds it at its module and qualified name and pickles it by reference; its ``__reduce_ex__`` then names it as
    Python names a method, ``getattr(owner, name)`` (``getattr(instance, name)`` where bound): the receiving
    process gets ITS attribute -- the shim's wrapper where the shim is active there, the upstream method where it
    is not (plain wrapt raises where cloudpickle does not copy it)."""
    if _METHOD_WRAPPER:
        return _METHOD_WRAPPER[0]
    import wrapt

    class BoundMethodWrapper(wrapt.BoundFunctionWrapper):
        def __reduce_ex__(self, protocol):
            owner, name = self._self_parent._self_shim_site
            instance = self._self_instance
            return getattr, (owner if instance is None else instance, name)

    class MethodWrapper(wrapt.FunctionWrapper):
        __bound_function_wrapper__ = BoundMethodWrapper

        def __get__(self, instance, owner=None):
            if instance is not None:
                return wrapt.FunctionWrapper.__get__(self, instance, owner)
            cached = self._self_shim_unbound
            if cached is None or cached[0] is not self.__wrapped__:  # re-pointed (a layer below taken out)
                site = self._self_shim_site[0]
                cached = (self.__wrapped__, wrapt.FunctionWrapper.__get__(self, None, site))
                self._self_shim_unbound = cached
            return cached[1]

    _METHOD_WRAPPER.append(MethodWrapper)
    return MethodWrapper
