"""``python -m shim doctor``: versions, allocator settings and the known bugs of this environment, one screen.

One row per upstream bug (``patches/bugs.py``; its sites are one row), only for distributions installed here;
the bugs of packages not installed are one line. A bug that bites only with a feature of the run (LoRA,
images, OnlineDPO, an MLA model, ...) or with a package not installed here is listed as "if you use X" and
never makes the exit status: doctor cannot know the run will use it. Features and checks have their own
section and never make the exit status. Exit 1 for a bug that hits every run of an installed release and is
not fixed in every process (its patch disabled, the shim off, or the shim reaching neither every interpreter
here nor this process and its children: :func:`_activation`), or for a switch with a bad value; 0 otherwise.

Doctor judges the way it was started, as the training would be started the same way: under the launcher
(``vllm-sleep-shim python -m shim doctor``) every process is fixed, as with ``python -m shim install``.
"""
from __future__ import annotations

import os
import sys

from shim.cli.common import check_trace_path, fail, help_asked
from shim.cli.install import PTH_NAME, always_on, site_packages
from shim.engine import catalog, config
from shim.engine.patch import FIX
from shim.engine.versions import in_range, installed
from shim.vllm import alloc_guard

DISTRIBUTIONS = ("torch", "vllm", "vllm-ascend", "trl", "ms-swift", "deepspeed", "wrapt")


def _device() -> str:
    """The accelerator torch sees here (the same detection the memory probes use)."""
    if installed("torch") is None:
        return "none"
    try:
        import torch  # noqa: F401  (imported for the probe, which reads sys.modules)
    except Exception as exc:
        return f"unusable ({type(exc).__name__})"
    from shim.vllm import memory

    return memory.device_type() or "none"


def _bugs(patches: list, bug_of: dict) -> list:
    """``(bug id, [its records among patches])`` per upstream bug, in registry order."""
    by_bug: dict = {}
    for patch in patches:
        by_bug.setdefault(bug_of[patch.id], []).append(patch)
    return list(by_bug.items())


def _short(reference: str) -> str:
    """``https://github.com/owner/repo/issues/N`` (or ``/pull/N``) -> ``owner/repo#N``."""
    parts = reference.rstrip("/").split("/")
    return f"{parts[-4]}/{parts[-3]}#{parts[-1]}" if len(parts) >= 5 and parts[-2] in ("issues", "pull") else reference


_BITES_WITH_EXPANDABLE = ("allocator-guard",)
"""Bugs whose feature doctor reads here: expandable segments in this environment's allocator setting."""
WIDTH = 100


def _fit(line: str) -> str:
    """One row within :data:`WIDTH` columns (one screen, also in a narrow terminal)."""
    return line if len(line) <= WIDTH else line[:WIDTH - 1] + "~"


def _foreign_shim() -> "str | None":
    """Where ``import shim`` goes for a script started in the working directory, when that is not
    this package (a ``shim.py`` or ``shim/`` beside the user's training script shadows it)."""
    import importlib.machinery

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.machinery.PathFinder.find_spec("shim", [os.getcwd()] + sys.path[1:])
    if spec is None or spec.origin is None:
        return None
    origin = os.path.realpath(spec.origin)
    if os.path.dirname(origin) == os.path.realpath(here):
        return None
    return origin


def _on(path: str, entries) -> bool:
    real = os.path.realpath(path)
    return any(p and os.path.realpath(p) == real for p in entries)


def _activation(off_all: bool) -> tuple:
    """``(route, line)``: how the shim reaches this process and the Python processes it starts. ``route``
    is '' when it does not reach them all (a bug it fixes is then "only where the shim runs"), else a
    few words for the rows: the ``.pth`` start-up line (every interpreter here); the launcher (its
    bootstrap directory was on PYTHONPATH when this interpreter started, so on ``sys.path``, and it
    activated the shim; every child inherits that PYTHONPATH); ``import shim.auto`` in this process
    (active, the bootstrap directory on ``os.environ["PYTHONPATH"]`` for the processes it starts)."""
    import shim

    pth = always_on()
    if pth:
        return "always on", pth
    boot = shim.bootstrap_dir()
    active = shim.is_active()
    if _on(boot, sys.path):
        if active or off_all:  # SHIM_DISABLED=1 makes its own verdict on every row
            return "through the launcher", (f"through the launcher ({boot} on PYTHONPATH): this process and every "
                                            "Python process it starts; start training the same way")
        return "", (f"{boot} is on PYTHONPATH but the shim is not active in this process (python -S?); "
                    f"not always on here (no {PTH_NAME}.pth in {site_packages()})")
    if active and _on(boot, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        return "import shim.auto", "import shim.auto in this process: it and the Python processes it starts"
    return "", f"not always on here (no {PTH_NAME}.pth in {site_packages()})"


def doctor(argv: list) -> int:
    if help_asked("doctor", argv):
        return 0
    if argv:
        return fail(f"doctor: unknown argument {argv[0]!r}")
    bad = [exc.line() for exc in config.problems()]
    _, trace_error = check_trace_path(os.environ.get(config.SHIM_TRACE, ""), config.SHIM_TRACE)
    bad += [trace_error] if trace_error else []
    off_all = config.problem(config.SHIM_DISABLED) is None and config.disabled()
    off, unknown = config.disabled_patches(catalog.ids(), catalog.removed(), catalog.bugs())
    versions = {dist: installed(dist) for dist in DISTRIBUTIONS}
    print(f"python {sys.version.split()[0]}; " + "; ".join(
        f"{d} {v}" + (f" (device: {_device()})" if d == "torch" else "") for d, v in versions.items() if v))
    missing = [d for d, v in versions.items() if not v]
    if missing:
        print(f"not installed: {', '.join(missing)}")
    routes = [f"{var}={os.environ[var]}" + ("  <- expandable segments ON" if alloc_guard.conf_expandable(os.environ[var])
                                               else "") for var in alloc_guard.ENV_VARS if var in os.environ]
    print(f"allocator: {'; '.join(routes) if routes else 'no PYTORCH_*_ALLOC_CONF set'}")
    expandable = any(alloc_guard.conf_expandable(os.environ[var]) for var in alloc_guard.ENV_VARS if var in os.environ)
    for line in bad:
        print(f"BAD SWITCH: {line}")
    if unknown:
        print(f"note: {config.SHIM_DISABLED_PATCHES} names unknown id(s) {', '.join(unknown)} (ignored)")
    foreign = _foreign_shim()
    if foreign:
        print(f"WARNING: in {os.getcwd()} `import shim` resolves to {foreign}, not this package; "
              f"launch with `vllm-sleep-shim ...` and rename that file")
    everywhere, line = _activation(off_all)
    print(f"activation: {line}" + (f"; {config.SHIM_DISABLED}=1: the shim is off" if off_all else ""))
    patches = catalog.all_patches()
    bug_of = {row[0]: row[3] for row in catalog.index()}
    bugs = catalog.bug_records()
    fixes = [p for p in patches if p.kind == FIX]
    here = [p for p in fixes if installed(p.distribution)]
    print("known bugs:")
    unfixed, later = [], []
    for bug_id, records in _bugs(here, bug_of):
        bug = bugs[bug_id]
        hit = [p for p in records if in_range(installed(p.distribution), p.affected)]
        dist = (hit or records)[0].distribution
        where = f"{dist} {installed(dist)}" + (f"; {_short(bug.reference)}" if bug.reference else "")
        if not hit:
            fixed = [p.fixed_in for p in records if p.fixed_in]
            print(f"  {bug_id:<26} not affected ({where}" + (f"; fixed in {fixed[0]})" if fixed else ")"))
            continue
        disabled = [p.id for p in hit if off_all or p.id in off]
        why = config.SHIM_DISABLED if off_all else f"{', '.join(disabled)} disabled"
        absent = [d for d in bug.needs if not installed(d)]
        when = "" if bug_id in _BITES_WITH_EXPANDABLE and expandable else bug.when
        if when or absent:  # bites only with a feature of the run, or a package not installed here: never exit 1
            state = f"NOT fixed ({why})" if disabled else "fixed" if everywhere else "fixed*"
            uses = " with ".join(([when] if when else []) + [f"{d} (not installed)" for d in absent])
            later.append(_fit(f"  {bug_id:<26} if you use {uses}: {state}"))
            continue
        if disabled:
            print(_fit(f"  {bug_id:<26} AFFECTED ({where}); {why}"))
            unfixed.append(bug_id)
        elif everywhere:
            print(_fit(f"  {bug_id:<26} affected ({where}); fixed"))
        else:
            print(_fit(f"  {bug_id:<26} AFFECTED ({where}); fixed only where the shim runs"))
            unfixed.append(bug_id)
    for line in later:
        print(line)
    if any(line.endswith("fixed*") for line in later):
        print("  * where the shim runs: start training with `vllm-sleep-shim CMD` to reach every process")
    absent = {bug_of[p.id] for p in fixes if not installed(p.distribution)} - {bug_of[p.id] for p in here}
    if absent:
        dists = sorted({p.distribution for p in fixes if not installed(p.distribution) and bug_of[p.id] in absent})
        print(f"  {len(absent)} known bugs of packages not installed here ({', '.join(dists)})")
    extras = [p for p in patches if p.kind != FIX and installed(p.distribution)
              and in_range(installed(p.distribution), p.affected)]
    if extras:
        print("features and checks:")
    for bug_id, records in _bugs(extras, bug_of):  # one row per feature or check (its records for this release)
        patch = records[0]
        if off_all or all(p.id in off for p in records):
            state = "off (disabled)"
        elif patch.switch and config.problem(patch.switch):
            state = "off (bad value, see above)"
        elif patch.switch and not config.switched_on(patch.switch):
            state = f"off ({patch.switch}=1: on)"
        else:
            state = "on" if everywhere else "on where it runs"
            some_off = [p.id for p in records if p.id in off]  # a part turned off: never plain "on"
            state += f"; {', '.join(some_off)} disabled" if some_off else ""
        print(_fit(f"  {bug_id:<26} {state}: {bugs[bug_id].problem}"))
    if bad:
        print(f"doctor: {len(bad)} switch(es) with a bad value (see BAD SWITCH above): fix them, "
              "`vllm-sleep-shim` refuses to start with them (exit 2)")
    if unfixed:
        print(f"doctor: {len(unfixed)} known bug(s) affect this environment and are not fixed in every process: "
              f"{', '.join(unfixed)}")
        if not everywhere and not off_all:
            print("doctor: start training through the shim (`vllm-sleep-shim CMD`), or make it always on with "
                  "`python -m shim install`")
    if bad or unfixed:
        return 1
    print("doctor: nothing known-bad left unhandled")
    return 0
