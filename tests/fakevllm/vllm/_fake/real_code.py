"""Fake-only: compile ONE method of a real upstream source file against the stand-in's modules.

A module such as vllm-ascend's ``vllm_ascend/worker/worker.py`` cannot be imported on a CPU host: it
imports torch_npu's CANN extensions (``torch_npu.op_plugin.atb``, ``torch_npu.profiler``), vLLM
internals the stand-in does not have (``vllm.distributed.ec_transfer``, ``vllm.v1.worker.workspace``,
...) and its own NPU model runner. One method of it often needs none of that: :func:`method` parses
the real file, takes the method's ``def`` as written there (line numbers kept, so tracebacks and
``inspect.getsource`` show the real file), and executes it with the global names the caller maps to
stand-in objects. A global the method reads that is not in the map is an ImportError naming it, so a
release whose method needs more fails loudly instead of running half of it.
"""
from __future__ import annotations

import ast
import builtins


def _free_names(fn: ast.FunctionDef) -> set:
    args = fn.args
    bound = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    bound |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    loaded = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return {n for n in loaded - bound if not hasattr(builtins, n)}


def method(path: str, class_name: str, method_name: str, names: dict):
    """The function ``class_name.method_name`` of the file ``path``, its globals taken from ``names``."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    fn = None if cls is None else next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method_name), None)
    if fn is None:
        raise ImportError(f"{path} defines no {class_name}.{method_name}")
    missing = sorted(_free_names(fn) - set(names))
    if missing:
        raise ImportError(f"real {class_name}.{method_name} ({path}) reads {', '.join(missing)}, which the "
                          f"stand-in does not provide")
    namespace = dict(names)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)
    function = namespace[method_name]
    function.__qualname__ = f"{class_name}.{method_name}"
    return function
