"""Facts about real vLLM releases, read from their wheels, for the stand-in's parity test.

    python -m tests.support.vllm_facts 0.34.0 0.33.0 ...   (from the repository root)

For each version: ``pip download --no-deps vllm==V`` into a cache outside the repository
(``$VLLM_WHEELS``, default ``/work/wheels``; kept across runs), then the wheel's ``.py`` files are
parsed with :mod:`ast` straight from the zip -- vLLM is never imported, no torch is needed -- and
``tests/data/vllm_facts/vllm-V.json`` is written: for every name in :func:`names` (``module`` or
``module:Qualname``), whether that release has it and, for a function or method, its parameters
(names, kinds, which have defaults); for a class, its bases. Facts only: no upstream source text.

The names are what the stand-in claims (every module of ``tests/fakevllm/vllm`` but ``_fake``, its
classes, their public methods and its public functions: :func:`stand_in_names`) plus what the
shim and its patches name (:data:`SHIM_NAMES`) plus upstream names the stand-in should model
(:data:`WATCHED`). ``tests/fakevllm/test_parity.py`` compares the stand-in, imitating each version,
with these files. Standard library only.
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAND_IN = os.path.join(REPO, "tests", "fakevllm", "vllm")
OUT = os.path.join(REPO, "tests", "data", "vllm_facts")
CACHE = os.environ.get("VLLM_WHEELS") or (
    "/work/wheels" if os.path.isdir("/work/wheels") else os.path.expanduser("~/.cache/vllm-sleep-shim/wheels"))
PLATFORMS = ["manylinux1", "manylinux2010", "manylinux2014"] + [f"manylinux_2_{i}" for i in range(17, 41)]
"""The Linux x86_64 wheel whatever machine runs the script (pip 23 does not widen one ``--platform`` tag)."""

# What the shim and its patches name in vLLM (probes, wrapped methods, imports in shim/vllm). One line a name.
SHIM_NAMES = [
    "vllm.entrypoints.llm:LLM.__init__", "vllm.entrypoints.llm:LLM.sleep", "vllm.entrypoints.llm:LLM.wake_up",
    "vllm.entrypoints.llm:LLM.generate", "vllm.entrypoints.llm:LLM.chat",
    "vllm.v1.engine.llm_engine:LLMEngine.__init__", "vllm.v1.engine.llm_engine:LLMEngine.sleep",
    "vllm.v1.engine.llm_engine:LLMEngine.wake_up", "vllm.v1.engine.llm_engine:LLMEngine.reset_prefix_cache",
    "vllm.v1.engine.core:EngineCore.wake_up", "vllm.v1.engine.core:EngineCore.sleep",
    "vllm.v1.worker.gpu_worker:Worker.__init__", "vllm.v1.worker.gpu_worker:Worker.sleep",
    "vllm.v1.worker.gpu_worker:Worker.wake_up", "vllm.v1.worker.gpu_worker:Worker.load_model",
    "vllm.v1.worker.gpu_worker:Worker.initialize_from_config",
    "vllm.device_allocator.cumem:CuMemAllocator", "vllm.device_allocator.cumem:CuMemAllocator.sleep",
    "vllm.device_allocator.cumem:CuMemAllocator.wake_up", "vllm.device_allocator.cumem:CuMemAllocator.use_memory_pool",
    "vllm.device_allocator.cumem:CuMemAllocator.get_instance",
    "vllm.platforms:current_platform",
    "vllm.model_executor.layers.attention:Attention", "vllm.model_executor.layers.attention:MLAAttention",
    "vllm.model_executor.model_loader.reload:initialize_layerwise_reload",
    "vllm.model_executor.model_loader.reload:finalize_layerwise_reload",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights",
    "vllm.engine.arg_utils:EngineArgs.__init__", "vllm.engine.arg_utils:AsyncEngineArgs.__init__",
]

# Upstream names on the sleep / wake / weight-update path that neither names yet but the stand-in should model
# where they exist (KV discard without a sleep, weight checksums, chunked weight updates, 0.34's extensible KV
# cache and reload). One line a name.
WATCHED = [
    "vllm.v1.executor.abstract:Executor.discard", "vllm.v1.worker.gpu_worker:Worker.discard",
    "vllm.v1.engine.core:EngineCore.release_kv_cache_memory",
    "vllm.v1.worker.gpu_worker:Worker.compute_weight_checksums",
    "vllm.v1.engine.async_llm:AsyncLLM.compute_weight_checksums",
    "vllm.v1.worker.gpu_worker:Worker.start_weight_update", "vllm.v1.worker.gpu_worker:Worker.update_weights",
    "vllm.v1.worker.gpu_worker:Worker.finish_weight_update",
    "vllm.v1.worker.extensible_kv_cache",
    "vllm.model_executor.layers.attention.attention:Attention.process_weights_after_loading",
    "vllm.model_executor.layers.attention.mla_attention:MLAAttention.process_weights_after_loading",
]


# ---------------------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------------------
def _module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _class_members(cls: ast.ClassDef):
    """Methods and method-like assignments (``wake_up = _a if ... else _b``) in a class body, not fields."""
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt.name
        elif isinstance(stmt, ast.Assign) and not isinstance(stmt.value, ast.Constant):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    yield target.id


def stand_in_names(root: str = STAND_IN) -> list:
    """What the stand-in claims, read statically (every version's union)."""
    out = set()
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        module = _module_name(root, path)
        if module.split(".")[1:2] == ["_fake"]:
            continue
        out.add(module)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for stmt in _top_level(tree.body):
            if isinstance(stmt, ast.ClassDef) and not stmt.name.startswith("_"):
                out.add(f"{module}:{stmt.name}")
                out.update(f"{module}:{stmt.name}.{m}" for m in _class_members(stmt) if _public(m))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not stmt.name.startswith("_"):
                out.add(f"{module}:{stmt.name}")
    return sorted(out)


def names() -> list:
    every = set(stand_in_names()) | set(SHIM_NAMES) | set(WATCHED)
    for name in list(every):  # the owners of every member: module, class
        module, _, qual = name.partition(":")
        every.add(module)
        if "." in qual:
            every.add(f"{module}:{qual.split('.')[0]}")
    return sorted(every)


# ---------------------------------------------------------------------------------------------------------
# signatures and bindings, from ast
# ---------------------------------------------------------------------------------------------------------
def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level(body):
    """Top-level statements, looking into ``if`` (not ``if TYPE_CHECKING``) and ``try`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(stmt.orelse)
            yield from _top_level(stmt.finalbody)
        else:
            yield stmt


def signature(args: ast.arguments, bound: bool = False) -> str:
    """``(level=, *, tags=)``: names in order, ``=`` where a default is present, ``/`` and ``*`` as in
    Python, ``*args`` / ``**kwargs``; ``bound``: without the first parameter (``self`` / ``cls`` of a method
    that is not a staticmethod). What the parity test compares."""
    parts = []
    positional = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        if not (bound and i == 0):
            parts.append(arg.arg + ("=" if default is not None else ""))
        if args.posonlyargs and i == len(args.posonlyargs) - 1 and not (bound and i == 0):
            parts.append("/")
    if args.vararg is not None:
        parts.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        parts.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        parts.append(arg.arg + ("=" if default is not None else ""))
    if args.kwarg is not None:
        parts.append("**" + args.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def _dotted(expr) -> "str | None":
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr}" if base else None
    if isinstance(expr, ast.Subscript):  # Generic[T], ABC[...]
        return _dotted(expr.value)
    return None


class Wheel:
    """The ``.py`` files of one wheel (or an unpacked tree), parsed on demand."""

    def __init__(self, path: str):
        self.path = path
        self._zip = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
        self._files = {}
        for name in (self._zip.namelist() if self._zip else self._walk(path)):
            if name.endswith(".py") and name.startswith("vllm/"):
                module = name[:-3].replace("/", ".")
                is_pkg = module.endswith(".__init__")
                self._files[module[:-9] if is_pkg else module] = (name, is_pkg)
        self._trees = {}
        self._bindings = {}

    @staticmethod
    def _walk(root):
        for path in glob.glob(os.path.join(root, "vllm", "**", "*.py"), recursive=True):
            yield os.path.relpath(path, root).replace(os.sep, "/")

    def has_module(self, module: str) -> bool:
        return module in self._files

    def tree(self, module: str):
        if module not in self._trees:
            name, _ = self._files[module]
            if self._zip:
                text = self._zip.read(name).decode("utf-8")
            else:
                with open(os.path.join(self.path, name), encoding="utf-8") as f:
                    text = f.read()
            self._trees[module] = ast.parse(text)
        return self._trees[module]

    def _absolute(self, module: str, target: "str | None", level: int) -> str:
        if not level:
            return target or ""
        _, is_pkg = self._files[module]
        parts = module.split(".")
        base = parts if is_pkg else parts[:-1]
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))

    def bindings(self, module: str) -> dict:
        """Top-level name -> ``("def", node)`` / ``("from", module, name)`` / ``("module", module)`` /
        ``("alias", name)`` / ``("value",)``; ``"*"`` -> list of star-imported modules."""
        if module in self._bindings:
            return self._bindings[module]
        out: dict = {"*": []}
        self._bindings[module] = out
        for stmt in _top_level(self.tree(module).body):
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                out[stmt.name] = ("def", stmt)
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt.module, stmt.level)
                for alias in stmt.names:
                    if alias.name == "*":
                        out["*"].append(source)
                    else:
                        out[alias.asname or alias.name] = ("from", source, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        out[alias.asname] = ("module", alias.name)
                    else:
                        out.setdefault(alias.name.split(".")[0], ("module", alias.name.split(".")[0]))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        value = stmt.value
                        out[target.id] = ("alias", value.id) if isinstance(value, ast.Name) else ("value", value)
        getattr_def = out.get("__getattr__")
        if getattr_def and getattr_def[0] == "def":  # ``if name == "current_platform":`` in a module __getattr__
            for node in ast.walk(getattr_def[1]):
                if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Eq, ast.In)):
                    for const in ast.walk(node.comparators[0]):
                        if isinstance(const, ast.Constant) and isinstance(const.value, str):
                            out.setdefault(const.value, ("value", None))
        lazy = out.get("MODULE_ATTRS")  # vllm/__init__.py: lazy attributes through __getattr__
        if lazy and lazy[0] == "value" and isinstance(lazy[1], ast.Dict) and "__getattr__" in out:
            for key, value in zip(lazy[1].keys, lazy[1].values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) and ":" in str(value.value):
                    where, attr = value.value.split(":")
                    level = len(where) - len(where.lstrip("."))
                    out.setdefault(key.value, ("from", self._absolute(module, where.lstrip(".") or None, level), attr))
        return out

    def resolve(self, module: str, name: str, depth: int = 0):
        """``(kind, defining module, node)`` for ``module.name``: kind ``class`` / ``function`` / ``module`` /
        ``value`` / ``external`` (outside vLLM); None where the release lacks it."""
        if depth > 30:
            return None
        if not self.has_module(module):
            return ("external", module, name) if not module.startswith("vllm") else None
        binding = self.bindings(module).get(name)
        if binding is None:
            for star in self.bindings(module)["*"]:
                found = self.resolve(star, name, depth + 1)
                if found is not None:
                    return found
            if self.has_module(f"{module}.{name}"):
                return ("module", f"{module}.{name}", None)
            return None
        if binding[0] == "def":
            node = binding[1]
            return ("class" if isinstance(node, ast.ClassDef) else "function", module, node)
        if binding[0] == "from":
            return self.resolve(binding[1], binding[2], depth + 1)
        if binding[0] == "module":
            return ("module", binding[1], None) if self.has_module(binding[1]) else ("external", binding[1], None)
        if binding[0] == "alias":
            return self.resolve(module, binding[1], depth + 1)
        return ("value", module, None)

    def resolve_dotted(self, module: str, dotted: str):
        head, *rest = dotted.split(".")
        found = self.resolve(module, head)
        for part in rest:
            if found is None:
                return None
            if found[0] == "module":
                found = self.resolve(found[1], part)
            elif found[0] == "external":
                return ("external", f"{found[1]}.{part}", None)
            else:
                return None
        return found

    def bases(self, module: str, cls: ast.ClassDef) -> list:
        """``(label, resolved)`` of each base."""
        out = []
        for base in cls.bases:
            dotted = _dotted(base)
            if dotted is None:
                continue
            found = self.resolve_dotted(module, dotted)
            if found is not None and found[0] == "class":
                out.append((f"{found[1]}:{found[2].name}", found))
            else:
                out.append((dotted, None))
        return out

    def member(self, module: str, cls: ast.ClassDef, name: str, seen=None):
        """``(kind, node, owner label)`` of ``cls.name`` through the class and its vLLM bases (kind ``function``,
        ``property``, ``value``), or None."""
        seen = seen if seen is not None else set()
        key = (module, cls.name)
        if key in seen:
            return None
        seen.add(key)
        found = None
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                decorators = {_dotted(d) for d in stmt.decorator_list}
                is_property = bool(decorators & {"property", "cached_property", "functools.cached_property"}) or any(
                    d and d.endswith((".setter", ".getter")) for d in decorators)
                found = ("property" if is_property else "function", stmt, f"{module}:{cls.name}")
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                found = ("value", None, f"{module}:{cls.name}")
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                found = ("value", None, f"{module}:{cls.name}")
        if found is not None:
            return found
        for _, base in self.bases(module, cls):
            if base is not None:
                found = self.member(base[1], base[2], name, seen)
                if found is not None:
                    return found
        return None

    def init_signature(self, module: str, cls: ast.ClassDef) -> "str | None":
        """``__init__`` where no class of the chain defines one: a dataclass's / msgspec Struct's from its fields,
        else None (inherited from outside vLLM: not known here)."""
        fields = self._fields(module, cls, set())
        if fields is None:
            return None
        positional = [f for f in fields if not f[2]]
        keyword = [f for f in fields if f[2]]
        parts = [n + ("=" if d else "") for n, d, _ in positional]
        if keyword:
            parts += ["*"] + [n + ("=" if d else "") for n, d, _ in keyword]
        return "(" + ", ".join(parts) + ")"

    def _fields(self, module: str, cls: ast.ClassDef, seen: set):
        """``[(name, has default, keyword-only)]`` of a dataclass / msgspec Struct chain, or None."""
        if (module, cls.name) in seen:
            return None
        seen.add((module, cls.name))
        decorators = [d.func if isinstance(d, ast.Call) else d for d in cls.decorator_list]
        is_dataclass = any((_dotted(d) or "").split(".")[-1] == "dataclass" for d in decorators)
        kw_only = any(isinstance(d, ast.Call) and (_dotted(d.func) or "").endswith("dataclass") and any(
            k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value for k in d.keywords)
            for d in cls.decorator_list)
        inherited = []
        is_struct = False
        for label, base in self.bases(module, cls):
            if base is None:
                is_struct = is_struct or label.split(".")[-1] == "Struct"
                continue
            got = self._fields(base[1], base[2], seen)
            if got is None:
                continue
            inherited = got
            is_dataclass = is_dataclass or bool(got)
        if not (is_dataclass or is_struct):
            return None
        kw_only = kw_only or any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
                                 for k in cls.keywords)
        fields = list(inherited)
        after_marker = False
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            annotation = _dotted(stmt.annotation) or ""
            if annotation.split(".")[-1] == "KW_ONLY":
                after_marker = True
                continue
            if annotation.split(".")[-1] in ("ClassVar", "InitVar") or stmt.target.id.startswith("__"):
                continue
            default = stmt.value is not None
            if isinstance(stmt.value, ast.Call) and (_dotted(stmt.value.func) or "").split(".")[-1] == "field":
                keywords = {k.arg: k.value for k in stmt.value.keywords}
                init = keywords.get("init")
                if isinstance(init, ast.Constant) and init.value is False:
                    continue
                default = "default" in keywords or "default_factory" in keywords
            fields = [f for f in fields if f[0] != stmt.target.id]
            fields.append((stmt.target.id, default, kw_only or after_marker))
        return fields


def _class_fact(wheel: Wheel, module: str, node: ast.ClassDef) -> dict:
    return {"kind": "class", "bases": [label for label, _ in wheel.bases(module, node)]}


def fact(wheel: Wheel, name: str) -> "dict | None":
    """What ``name`` (``module`` or ``module:Qual.name``) is in ``wheel``; None where it is absent."""
    module, _, qual = name.partition(":")
    if not qual:
        return {"kind": "module"} if wheel.has_module(module) else None
    if not wheel.has_module(module):
        return None
    head, _, member = qual.partition(".")
    found = wheel.resolve(module, head)
    if found is None:
        return None
    kind, where, node = found
    if not member:
        if kind == "class":
            out = _class_fact(wheel, where, node)
        elif kind == "function":
            out = {"kind": "function", "sig": signature(node.args)}
        else:
            out = {"kind": kind}
        if kind in ("class", "function") and where != module:
            out["defined_in"] = where
        return out
    if kind != "class":
        return None
    got = wheel.member(where, node, member)
    if got is None and member == "__init__":  # every class has one
        return {"kind": "function", "sig": wheel.init_signature(where, node)}
    if got is None:
        return None
    member_kind, member_node, owner = got
    out = {"kind": member_kind}
    if member_kind == "function":
        static = any(_dotted(d) == "staticmethod" for d in member_node.decorator_list)
        out["sig"] = signature(member_node.args, bound=not static)
    if owner != f"{where}:{node.name}":
        out["inherited_from"] = owner
    return out


# ---------------------------------------------------------------------------------------------------------
# wheels and files
# ---------------------------------------------------------------------------------------------------------
def wheel_for(version: str, cache: str = CACHE) -> str:
    """The cached wheel of ``vllm==version``, downloaded first where it is missing."""
    def cached():
        return sorted(glob.glob(os.path.join(cache, f"vllm-{version}-*.whl")))

    if not cached():
        os.makedirs(cache, exist_ok=True)
        platforms = [arg for tag in PLATFORMS for arg in ("--platform", f"{tag}_x86_64")]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *platforms,
                        "--python-version", "3.12", "--implementation", "cp", "--dest", cache, f"vllm=={version}"],
                       check=True)
    found = cached()
    if not found:
        raise SystemExit(f"no wheel for vllm=={version} in {cache}")
    return found[0]


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def facts(version: str, wheel_path: str, wanted: list) -> dict:
    wheel = Wheel(wheel_path)
    return {
        "vllm": version,
        "wheel": os.path.basename(wheel_path),
        "wheel_sha256": _sha256(wheel_path),
        "generator": "python -m tests.support.vllm_facts " + version,
        "names": {name: fact(wheel, name) for name in wanted},
    }


def write(version: str, data: dict, out: str = OUT) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"vllm-{version}.json")
    head = {k: v for k, v in data.items() if k != "names"}
    lines = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in sorted(head.items())]
    entries = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data["names"].items())]
    with open(path, "w", encoding="utf-8") as f:  # one name a line: a new release's diff reads line by line
        f.write("{\n" + "\n".join(lines) + '\n "names": {\n' + ",\n".join(entries) + "\n }\n}\n")
    return path


def _ignored(path: str) -> bool:
    inside = os.path.abspath(path).startswith(REPO + os.sep)
    if not inside:
        return True
    return subprocess.run(["git", "-C", REPO, "check-ignore", "-q", path]).returncode == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.vllm_facts", description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="vLLM releases, e.g. 0.34.0")
    parser.add_argument("--cache", default=CACHE, help="wheel cache outside the repository ($VLLM_WHEELS)")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    if not _ignored(args.cache):
        raise SystemExit(f"{args.cache} is inside the repository and not git-ignored: wheels are never committed")
    wanted = names()
    for version in args.versions:
        path = write(version, facts(version, wheel_for(version, args.cache), wanted), args.out)
        with open(path, encoding="utf-8") as f:
            present = sum(1 for v in json.load(f)["names"].values() if v is not None)
        print(f"{path}: {present}/{len(wanted)} names present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
