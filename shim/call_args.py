"""Arguments of a wrapped upstream call, bound by name (signatures change between releases).

``inspect.signature`` costs ~0.1 ms a call uncached, on every sleep and wake: it is
cached per underlying function (bound methods of one function share it).
"""
from __future__ import annotations

import inspect

_signatures: dict = {}


def signature(wrapped):
    key = getattr(wrapped, "__func__", wrapped)
    try:
        return _signatures[key]
    except (KeyError, TypeError):
        pass
    sig = inspect.signature(wrapped)
    try:
        _signatures[key] = sig
    except TypeError:  # unhashable callable
        pass
    return sig


def arg(wrapped, args, kwargs, name, default=None):
    """Argument ``name`` of a call of ``wrapped(*args, **kwargs)``, else ``default``."""
    if name in kwargs:
        return kwargs[name]
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
