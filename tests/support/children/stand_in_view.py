"""The stand-in's view of a list of vLLM names, in the format of ``tests/support/vllm_facts.py``.

Run with the stand-in's site dir for one version first on the path and ``FAKEVLLM_VERSION`` set:
``argv[1]`` a JSON file holding the names (``module`` or ``module:Qual.name``); prints one JSON line
``{name: fact or null}``. Imports the stand-in (unlike the facts script, which never imports vLLM).
"""
import importlib
import inspect
import json
import sys


def render(func, bound=False):
    """``(level=, *, tags=)``, as ``vllm_facts.signature`` writes it (``bound``: without ``self`` / ``cls``);
    None where there is none."""
    try:
        sig = inspect.signature(func, follow_wrapped=True)
    except (TypeError, ValueError):
        return None
    parts, star = [], False
    params = list(sig.parameters.values())
    if bound and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    for i, p in enumerate(params):
        mark = "=" if p.default is not p.empty else ""
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(p.name + mark)
        else:
            parts.append(p.name + mark)
            nxt = params[i + 1] if i + 1 < len(params) else None
            if p.kind is p.POSITIONAL_ONLY and (nxt is None or nxt.kind is not p.POSITIONAL_ONLY):
                parts.append("/")
    return "(" + ", ".join(parts) + ")"


def _vllm(cls) -> bool:
    return (getattr(cls, "__module__", "") or "").split(".")[0] == "vllm"


def member(cls, name):
    for klass in cls.__mro__:
        if not _vllm(klass) or name not in vars(klass):
            continue
        raw = vars(klass)[name]
        bound = not isinstance(raw, staticmethod)
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property) or type(raw).__name__ == "cached_property":
            return {"kind": "property"}
        if inspect.isfunction(raw) or inspect.ismethod(raw) or callable(raw) and hasattr(raw, "__wrapped__"):
            return {"kind": "function", "sig": render(raw, bound)}
        return {"kind": "value"}
    if name == "__init__":  # every class has one; inherited from outside vLLM: not known
        return {"kind": "function", "sig": None}
    return None


def fact(name):
    module_name, _, qual = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    if not qual:
        return {"kind": "module"}
    head, _, rest = qual.partition(".")
    obj = getattr(module, head, None)
    if obj is None and not hasattr(module, head):
        return None
    if not rest:
        if inspect.ismodule(obj):
            return {"kind": "module"}
        if inspect.isclass(obj):
            return {"kind": "class"}
        if inspect.isfunction(obj) or inspect.isbuiltin(obj):
            return {"kind": "function", "sig": render(obj)}
        return {"kind": "value"}
    if not inspect.isclass(obj):
        return None
    return member(obj, rest)


def main():
    with open(sys.argv[1]) as f:
        names = json.load(f)
    print(json.dumps({name: fact(name) for name in names}, sort_keys=True))


main()
