"""The stand-in against real vLLM: names and signatures, version by version, and the patches' probes.

``tests/data/vllm_facts/vllm-X.json`` holds what the real wheel of vLLM X has (``python -m
tests.support.vllm_facts X``: read with ``ast`` from the wheel, never imported): for every name the
stand-in claims, the shim names or ``WATCHED`` lists, whether it exists and its parameters. Here, for
each of those files, the stand-in imitating X (its site dir in ``tmp_path``, imported in a warm child by
``tests/support/children/stand_in_view.py``) gives the same facts, and every difference is one line:

- a name one side has and the other lacks (a module, class, function or method);
- a name of another kind (class vs function vs attribute);
- a function or method whose parameters a caller would trip on (:func:`signature_drift`: a real parameter
  the stand-in does not accept, a stand-in one real vLLM rejects, a required positional one at another
  position, an optional one made required), where both signatures are known (an ``__init__`` inherited
  from outside vLLM is not).

Known, deliberate differences are in ``tests/data/vllm_facts/known_drift.json``, each with its reason;
a pattern there that excuses no difference fails too. The second test runs every vLLM patch's probe against a module
built from each in-range version's facts (functions with the real parameters): a probe that would
stand down with "upstream shape changed" on the real shape fails. Probes that read source text
(``inspect.getsource``) cannot be judged from facts: they are skipped, by name, in the output.
"""
from __future__ import annotations

import fnmatch
import inspect
import json
import sys
import types

import pytest
from packaging.version import Version

from tests.support import vllm_facts
from tests.support.helpers import REPO, clean_env, last_json, run_python

DATA = REPO / "tests" / "data" / "vllm_facts"
FACTS = sorted(DATA.glob("vllm-*.json"), key=lambda p: Version(p.stem[5:]))
VERSIONS = [p.stem[5:] for p in FACTS]
KNOWN = json.loads((DATA / "known_drift.json").read_text())["known"]
VIEW = REPO / "tests" / "support" / "children" / "stand_in_view.py"
pytestmark = pytest.mark.xdist_group("vllm-parity")  # the stand-in's views are read once, on one worker
RERUN = f"python -m tests.support.vllm_facts {' '.join(VERSIONS)}"


def facts(version: str) -> dict:
    return json.loads((DATA / f"vllm-{version}.json").read_text())


def stand_in_view(tmp_path, version: str, names: list) -> dict:
    sys.path.insert(0, str(REPO / "tests" / "fakevllm"))
    try:
        import make_site
    finally:
        sys.path.pop(0)
    site = make_site.make_site(str(tmp_path / f"site-{version}"), version=version)
    listing = tmp_path / "names.json"
    listing.write_text(json.dumps(names))
    env = clean_env(FAKEVLLM_VERSION=version, FAKEVLLM_DEVICE="cuda", VLLM_LOGGING_LEVEL="ERROR", OMP_NUM_THREADS="1")
    for key in [k for k in env if k.startswith("FAKEVLLM_") and k not in ("FAKEVLLM_VERSION", "FAKEVLLM_DEVICE")]:
        del env[key]
    proc = run_python(VIEW.read_text(), path=[site], env=env, argv=[str(listing)])
    return last_json(proc)


def _kind(fact: dict) -> str:
    return {"property": "attribute", "value": "attribute"}.get(fact["kind"], fact["kind"])


def _same_kind(real: dict, ours: dict) -> bool:
    """A plain value (``get_tokenizer = ...``, a field) may be anything callable or not, but no module."""
    if "value" in (real["kind"], ours["kind"]):
        return "module" not in (real["kind"], ours["kind"])
    return _kind(real) == _kind(ours)


def parse(sig: str) -> dict:
    """``positional`` [(name, has default)], ``keyword`` {name: has default} (every name a caller may pass by
    keyword), ``args`` / ``kwargs`` (variadics present)."""
    out = {"positional": [], "keyword": {}, "args": False, "kwargs": False}
    star = False
    tokens = [t for t in sig[1:-1].split(", ") if t]
    posonly = "/" in tokens
    for token in tokens:
        if token == "/":
            posonly = False
        elif token == "*":
            star = True
        elif token.startswith("**"):
            out["kwargs"] = True
        elif token.startswith("*"):
            out["args"] = star = True
        else:
            name, default = token.rstrip("="), token.endswith("=")
            if not star:
                out["positional"].append((name, default))
            if not posonly:
                out["keyword"][name] = default
    return out


def signature_drift(real: str, ours: str) -> list:
    """What a caller written against the real signature, or code tested on the stand-in's, would trip on:
    a real parameter the stand-in does not accept, a stand-in parameter real vLLM does not accept, a shared
    positional parameter at another position, one real vLLM makes optional and the stand-in requires. A
    stand-in ``*args`` / ``**kwargs`` accepts what it swallows (a deliberate simplification)."""
    r, s = parse(real), parse(ours)
    out = []
    lacks = [n for n in r["keyword"] if n not in s["keyword"] and not s["kwargs"]]
    extra = [n for n in s["keyword"] if n not in r["keyword"] and not r["kwargs"]]
    if lacks:
        out.append(f"the stand-in lacks parameter {', '.join(lacks)}")
    if extra:
        out.append(f"the stand-in has parameter {', '.join(extra)} real vLLM lacks")
    real_pos, our_pos = [n for n, _ in r["positional"]], [n for n, _ in s["positional"]]
    required = {n for n, d in r["positional"] if not d}  # passed by position: optional ones go by keyword
    moved = [n for n in real_pos if n in required and n in our_pos and real_pos.index(n) != our_pos.index(n)]
    if moved:
        out.append(f"{', '.join(moved)} at another position")
    stricter = [n for n, d in r["keyword"].items() if d and s["keyword"].get(n) is False]
    if stricter:
        out.append(f"the stand-in requires {', '.join(stricter)} (optional in real vLLM)")
    return out


def _owners(name: str) -> list:
    module, _, qual = name.partition(":")
    parts = module.split(".")
    owners = [".".join(parts[:i]) for i in range(1, len(parts))] + ([module] if qual else [])
    if "." in qual:
        owners.append(f"{module}:{qual.split('.')[0]}")
    return owners


def differences(real: dict, ours: dict) -> list:
    """``(name, what, line)`` for every name where the stand-in and the real release differ (a member of a
    module or class one side lacks is not repeated)."""
    out, absent = [], {}
    for name in sorted(real):
        r, s = real[name], ours.get(name)
        if r is None and s is None:
            continue
        if s is None or r is None:
            what = "missing" if s is None else "extra"
            if any(absent.get(owner) == what for owner in _owners(name)):
                continue
            absent[name] = what
            if what == "missing":
                out.append((name, what, f"real vLLM has {name} ({r['kind']}), the stand-in lacks it"))
            else:
                out.append((name, what, f"the stand-in has {name} ({s['kind']}), real vLLM lacks it"))
        elif not _same_kind(r, s):
            out.append((name, "kind", f"{name}: real vLLM has a {r['kind']}, the stand-in a {s['kind']}"))
        elif r.get("sig") is not None and s.get("sig") is not None:
            drift = signature_drift(r["sig"], s["sig"])
            if drift:
                out.append((name, "signature", f"{name}{s['sig']}: {'; '.join(drift)} (real {r['sig']})"))
    return out


def _known(version: str, name: str, what: str):
    """``(entry index, pattern)`` of the known_drift.json entry covering this difference, or None."""
    for i, entry in enumerate(KNOWN):
        if what not in entry["what"].split("|") or not in_range(version, entry["versions"]):
            continue
        for pattern in entry["names"]:
            if fnmatch.fnmatchcase(name, pattern):
                return i, pattern
    return None


def in_range(version: str, spec: str) -> bool:
    from shim.engine.versions import in_range as inside

    return inside(version, spec)


@pytest.fixture(scope="module")
def drift(tmp_path_factory) -> dict:
    """version -> the differences between the stand-in imitating it and its facts (one child per version)."""
    out = {}
    for version in VERSIONS:
        data = facts(version)
        ours = stand_in_view(tmp_path_factory.mktemp(f"parity-{version}"), version, sorted(data["names"]))
        out[version] = differences(data["names"], ours)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_facts_cover_what_the_stand_in_and_shim_name(version):
    stale = sorted(set(vllm_facts.names()) - set(facts(version)["names"]))
    assert not stale, (f"vllm-{version}.json has no facts for {len(stale)} names the stand-in or the shim now "
                       f"uses ({', '.join(stale[:8])}{' ...' if len(stale) > 8 else ''}): run `{RERUN}`")


@pytest.mark.parametrize("version", VERSIONS)
def test_stand_in_matches_real_vllm(version, drift):
    lines = [f"vLLM {version}: {line}" for name, what, line in drift[version] if _known(version, name, what) is None]
    assert not lines, (f"the stand-in imitating vLLM {version} differs from the real wheel ({len(lines)}; fix the "
                       f"stand-in, or list a deliberate simplification in {DATA.name}/known_drift.json with its "
                       "reason):\n" + "\n".join(lines))


def test_known_drift_is_still_needed(drift):
    """Every pattern of known_drift.json excuses some difference in a version of its range: else it goes."""
    used = {_known(v, name, what) for v, found in drift.items() for name, what, _ in found}
    stale = [f"{entry['what']} {pattern} ({entry['versions'] or 'every version'})" for i, entry in enumerate(KNOWN)
             for pattern in entry["names"] if (i, pattern) not in used]
    assert not stale, "known_drift.json patterns that excuse no difference any more:\n" + "\n".join(stale)


def test_known_drift_has_reasons():
    for entry in KNOWN:
        assert set(entry) == {"names", "what", "versions", "reason"}, entry
        assert set(entry["what"].split("|")) <= {"missing", "extra", "kind", "signature"}, entry
        assert entry["names"] and len(entry["reason"]) > 15, entry


# ---------------------------------------------------------------------------------------------------------
# the patches' probes on the real shapes
# ---------------------------------------------------------------------------------------------------------
SOURCE_PROBES = {
    "vllm-level2-buffers": "reads Worker.wake_up's source (is the buffer restore gated on the weights tag?)",
    "vllm-level2-tensors": "reads Worker.sleep's source (does the level-2 sleep save module attributes?)",
}
"""vLLM patches whose probes read upstream source text: facts cannot answer them (the contract tests run them on the
stand-in, the GPU rounds on real vLLM)."""


class ReadsSource(Exception):
    """Raised where a probe reads source text: facts cannot answer it."""


def _function(name: str, sig: "str | None"):
    params = (sig or "(*args, **kwargs)")[1:-1]
    params = ", ".join(p[:-1] + "=None" if p.endswith("=") else p for p in params.split(", ") if p)
    scope: dict = {}
    exec(f"def {name}({params}):\n    pass\n", scope)  # noqa: S102 - parameters from our own facts file
    return scope[name]


def fake_modules(names: dict) -> dict:
    """Modules holding the real release's names: classes with the real methods (parameters included)."""
    modules = {}
    for name, fact in names.items():
        module = name.partition(":")[0]
        if fact is not None:
            modules.setdefault(module, types.ModuleType(module))
    classes: dict = {}
    for name, fact in sorted(names.items()):
        module, _, qual = name.partition(":")
        if fact is None or not qual:
            continue
        head, _, member = qual.partition(".")
        if not member:
            if fact["kind"] == "class":
                classes[(module, head)] = {}
            elif fact["kind"] == "function":
                setattr(modules[module], head, _function(head, fact.get("sig")))
            else:
                setattr(modules[module], head, object())
            continue
        body = classes.setdefault((module, head), {})
        if fact["kind"] == "function":
            body[member] = _function(member, fact.get("sig"))
        elif fact["kind"] == "property":
            body[member] = property(lambda self: None)
        else:
            body[member] = None
    for (module, head), body in classes.items():
        setattr(modules[module], head, type(head, (), {**body, "__module__": module}))
    return modules


def _vllm_patches():
    from shim.engine import catalog

    return [p for p in catalog.all_patches() if p.distribution == "vllm" and p.probe is not None]


def test_probes_pass_on_real_shapes(monkeypatch):
    from shim.engine import probes
    from shim.engine.versions import in_range
    from shim.vllm.sleep import memory

    device = types.SimpleNamespace(name="cuda")
    monkeypatch.setattr(memory, "probe", lambda: device)  # a CUDA device: the probes judge the shape only
    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "1")

    def no_source(*args, **kwargs):
        raise ReadsSource()

    monkeypatch.setattr(inspect, "getsource", no_source)
    failures, skipped, checked = [], set(), 0
    for version in VERSIONS:
        modules = fake_modules(facts(version)["names"])
        with monkeypatch.context() as m:
            for name in [n for n in list(sys.modules) if n == "vllm" or n.startswith("vllm.")]:
                m.delitem(sys.modules, name)
            for name, module in modules.items():
                m.setitem(sys.modules, name, module)
            for patch in _vllm_patches():
                if not in_range(version, patch.affected):
                    continue
                module = modules.get(patch.module)
                try:
                    reason = patch.probe(module) if module is not None else probes.changed(f"no {patch.module}")
                except ReadsSource:
                    skipped.add(patch.id)
                    continue
                checked += 1
                if probes.is_changed(reason):
                    failures.append(f"vLLM {version}: {patch.id} ({patch.module}): {reason}")
    print(f"probes checked: {checked}; skipped (read source text): {', '.join(sorted(skipped)) or 'none'}")
    assert checked, "no vLLM patch probe was checked"
    assert skipped == set(SOURCE_PROBES), f"probes reading source text: {sorted(skipped)}, listed: {sorted(SOURCE_PROBES)}"
    assert not failures, "probes that stand down on the real shape:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------------------------------------
# the facts script itself, on a small wheel made here
# ---------------------------------------------------------------------------------------------------------
_TOY = {
    "vllm/__init__.py": 'MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}\n\ndef __getattr__(name):\n    pass\n',
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": (
        "from vllm.base import Base\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import Hidden\n"
        "class LLM(Base):\n    def sleep(self, level: int = 1, *, mode='abort'):\n        pass\n"
        "    @staticmethod\n    def make(a, /, b, *args, c, **kw):\n        pass\n"
        "    @property\n    def size(self):\n        return 1\n"),
    "vllm/base.py": "class Base:\n    def wake_up(self, tags=None):\n        pass\n",
    "vllm/params.py": (
        "from dataclasses import dataclass, field\n@dataclass\nclass P:\n    a: int\n    b: int = 2\n"
        "    c: list = field(default_factory=list)\n    d: int = field(init=False)\n"),
    "vllm/platforms/__init__.py": "def __getattr__(name):\n    if name == 'current_platform':\n        return 1\n",
}


def test_facts_script_reads_a_wheel(tmp_path):
    import zipfile

    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in _TOY.items():
            z.writestr(name, text)
    got = vllm_facts.facts("9.9.9", str(wheel), [
        "vllm:LLM", "vllm.entrypoints.llm:LLM.sleep", "vllm.entrypoints.llm:LLM.wake_up",
        "vllm.entrypoints.llm:LLM.make", "vllm.entrypoints.llm:LLM.size", "vllm.entrypoints.llm:LLM.gone",
        "vllm.entrypoints.llm:Hidden", "vllm.params:P.__init__", "vllm.platforms:current_platform", "vllm.missing",
        "vllm.entrypoints"])["names"]
    assert got["vllm:LLM"] == {"kind": "class", "bases": ["vllm.base:Base"], "defined_in": "vllm.entrypoints.llm"}
    assert got["vllm.entrypoints.llm:LLM.sleep"] == {"kind": "function", "sig": "(level=, *, mode=)"}
    assert got["vllm.entrypoints.llm:LLM.wake_up"] == {"kind": "function", "sig": "(tags=)",
                                                       "inherited_from": "vllm.base:Base"}
    assert got["vllm.entrypoints.llm:LLM.make"]["sig"] == "(a, /, b, *args, c, **kw)"
    assert got["vllm.entrypoints.llm:LLM.size"] == {"kind": "property"}
    assert got["vllm.params:P.__init__"]["sig"] == "(a, b=, c=)"
    assert got["vllm.platforms:current_platform"] == {"kind": "value"}
    assert got["vllm.entrypoints"] == {"kind": "module"}
    for absent in ("vllm.entrypoints.llm:LLM.gone", "vllm.entrypoints.llm:Hidden", "vllm.missing"):
        assert got[absent] is None, absent
    assert "def " not in json.dumps(got)  # facts, no source text


def test_signature_drift_rules():
    assert signature_drift("(tags=)", "(tags=)") == []
    assert signature_drift("(tags=)", "(tag_list=)") == ["the stand-in lacks parameter tags",
                                                         "the stand-in has parameter tag_list real vLLM lacks"]
    assert signature_drift("(level=, *, mode=)", "(*args, **kwargs)") == []  # swallowed: a deliberate simplification
    assert signature_drift("(a, b)", "(b, a)") == ["a, b at another position"]
    assert signature_drift("(level=)", "(level)") == ["the stand-in requires level (optional in real vLLM)"]
