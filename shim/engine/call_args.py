"""Arguments of a wrapped upstream call, bound by name (signatures change between releases).

``inspect.signature`` costs ~0.1 ms a call uncached, on every sleep and wake: it is
cached per underlying function (bound methods of one function share it).
"""
from __future__ import annotations

import inspect

_signatures: dict = {}


def _partial_of(wrapped):
    """The function under wrapt's ``PartialCallableObjectProxy(function, instance)``, else None: what a wrapper
    gets as ``wrapped`` for a method called through its class with the instance first (``Cls.method(obj, ...)``;
    a Ray actor calls every method so, ``ray/util/tracing/tracing_helper.py`` ``_resume_span``). wrapt 2.x's
    signature of it drops the instance, wrapt 1.x's keeps it (``self`` would take the first argument); and it
    compares and hashes equal to the function (a cache keyed on it would hand out the class function's
    signature)."""
    return wrapped.__wrapped__ if type(wrapped).__name__ == "PartialCallableObjectProxy" else None


def _key(wrapped):
    """The cache key: the function, and whether it comes bound (a bound method's signature has no ``self``; a
    probe reading the class's function must not leave its signature for the wrapper's bound calls)."""
    function = _partial_of(wrapped)
    if function is not None:
        return function, True
    return getattr(wrapped, "__func__", wrapped), hasattr(wrapped, "__self__")


def signature(wrapped):
    key = _key(wrapped)
    try:
        return _signatures[key]
    except (KeyError, TypeError):
        pass
    function = _partial_of(wrapped)
    if function is not None:  # the instance is bound: the signature without the first parameter
        sig = inspect.signature(function)
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    else:
        sig = inspect.signature(wrapped)
    try:
        _signatures[key] = sig
    except TypeError:  # unhashable callable
        pass
    return sig


_positional: dict = {}


def positional_names(wrapped) -> "tuple | None":
    """Names of ``wrapped``'s positional parameters in order; None when it takes ``*args``
    (or has no signature). Cached as :func:`signature` is."""
    key = _key(wrapped)
    try:
        return _positional[key]
    except (KeyError, TypeError):
        pass
    try:
        params = signature(wrapped).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = None if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params) else \
        tuple(p.name for p in params if p.kind in kinds)
    try:
        _positional[key] = names
    except TypeError:
        pass
    return names


def arg(wrapped, args, kwargs, name, default=None):
    """Argument ``name`` of a call of ``wrapped(*args, **kwargs)``, else ``default``.

    A call with positional arguments only (``wake_up(["weights"])``, ``sleep(2)``) is read
    from the positions of the cached signature; anything else is bound by ``inspect``
    (~25 us a call)."""
    if name in kwargs:
        return kwargs[name]
    if not kwargs:
        names = positional_names(wrapped)
        if names is not None:
            if len(args) > len(names):
                return default  # would not bind
            return args[names.index(name)] if name in names[:len(args)] else default
    try:
        bound = signature(wrapped).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return default
    if name in bound.arguments:
        return bound.arguments[name]
    for value in bound.arguments.values():  # **kwargs of the callee
        if isinstance(value, dict) and name in value:
            return value[name]
    return default


def requested_sleep_mode(wrapped, args, kwargs) -> "bool | None":
    """``enable_sleep_mode`` asked of an engine construction (``LLM(enable_sleep_mode=...)``,
    ``LLMEngine(vllm_config)``, ``from_engine_args(engine_args)``); None when not said."""
    value = arg(wrapped, args, kwargs, "enable_sleep_mode")
    if value is not None:
        return bool(value)
    for name in ("vllm_config", "engine_args"):
        cfg = arg(wrapped, args, kwargs, name)
        if cfg is not None:
            mc = getattr(cfg, "model_config", cfg)
            if getattr(mc, "enable_sleep_mode", None) is not None:
                return bool(mc.enable_sleep_mode)
    return None
