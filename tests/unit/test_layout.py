"""The shape of the code (issue 28), pinned so a regression is a red test, not a finding of the next review:
every module of ``shim/`` and ``patches/`` at most 400 lines with a module docstring of at most 12 lines, no
import circle between them, and no module reading another's private names."""
import ast
import pathlib

from tests.support.helpers import REPO

MODULES = sorted([*REPO.glob("shim/**/*.py"), *REPO.glob("patches/*.py")])


def name_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "patches":
        parts.insert(0, "shim")  # installed as shim.patches
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {name_of(p): p for p in MODULES}


def shim_imports(tree: ast.AST, here: str) -> dict:
    """``{local name: module}`` for every ``shim`` module this tree imports (at any depth: a function's
    lazy import is an arrow too), and the set of private names it takes ``from`` one."""
    bound, private = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NAMES or alias.name.replace("patches", "shim.patches", 1) in NAMES:
                    bound[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module.replace("patches", "shim.patches", 1) if node.module.startswith("patches") \
                else node.module
            if module not in NAMES:
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if full in NAMES:
                    bound[alias.asname or alias.name] = full
                else:
                    bound.setdefault(f"<from {module}>", module)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.add(full)
    return bound, private


def graph() -> dict:
    edges, reach_ins = {}, []
    for name, path in NAMES.items():
        tree = ast.parse(path.read_text())
        bound, private = shim_imports(tree, name)
        edges[name] = {m for m in bound.values() if m != name}
        reach_ins += [f"{name} imports {p}" for p in sorted(private)]
        modules = {local: m for local, m in bound.items() if not local.startswith("<")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in modules and modules[node.value.id] != name and \
                    node.attr.startswith("_") and not node.attr.startswith("__"):
                reach_ins.append(f"{name} reads {modules[node.value.id]}.{node.attr}")
    return edges, reach_ins


def circles(edges: dict) -> list:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_edges(edges: dict) -> dict:
    """A package's ``__init__`` is imported on the way to any of its modules: not an arrow of the import."""
    return {m: {t for t in targets if not (m.startswith(t + ".") and NAMES[t].name == "__init__.py")}
            for m, targets in edges.items()}


def test_every_module_is_short_and_says_why_briefly():
    long = {}
    for path in MODULES:
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        lines, doc_lines = len(text.splitlines()), len(doc.splitlines())
        if lines > 400 or doc_lines > 12:
            long[str(path.relative_to(REPO))] = (lines, doc_lines)
    assert not long, f"(lines, module docstring lines) over 400 / 12: {long}"


def test_no_import_circle():
    edges, _ = graph()
    assert len(edges) == len(MODULES) and edges["shim.cli.status"], edges.get("shim.cli.status")
    assert not circles(package_edges(edges))


def test_no_module_reads_another_ones_private_names():
    _, reach_ins = graph()
    assert not reach_ins, reach_ins


def test_the_checks_see_a_circle_and_a_reach_in():
    """The checks themselves: a made-up circle and a private read are found."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("from shim.engine import registry\nfrom shim.engine.log import _once\nregistry._decide(1)\n")
    bound, private = shim_imports(tree, "shim.x")
    assert bound["registry"] == "shim.engine.registry" and private == {"shim.engine.log._once"}
