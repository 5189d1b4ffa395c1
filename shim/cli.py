"""Subcommands of ``python -m shim``: status, doctor, install, uninstall, report.

Each prints its usage with ``-h`` / ``--help`` (exit 0); a bad argument is one line
on stderr and exit 2. :func:`check_trace_path` validates ``--trace PATH`` /
``SHIM_TRACE`` for the launcher before anything starts.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import sysconfig

from shim import config, patching, registry
from shim.versions import installed, in_range

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
DISTRIBUTIONS = ("torch", "vllm", "vllm-ascend", "trl", "ms-swift", "deepspeed", "wrapt")
PTH_NAME = "vllm_sleep_shim"
PTH_LINE = (
    "import sys; exec('try:\\n import shim._startup as s; s.main()\\nexcept Exception as e:\\n"
    " print(\"[shim] ERROR start-up: %r\" % (e,), file=sys.stderr)')\n"
)


FEATURE = "feature"
"""``Patch.issue`` of a record that adds a feature (no upstream bug): doctor lists it apart."""

USAGE = {
    "status": """usage: python -m shim status [--json] [--import]

One row per patch: id, upstream issue, distribution, installed version, affected
range and the decision in this environment (applied, stand down: <why>,
waiting: <module> not imported, disabled, failed: <why>).
  --json     the rows as JSON (id, distribution, installed, affected, decision, reason)
  --import   import each hooked upstream module first, so every row is decided""",
    "doctor": """usage: python -m shim doctor

Prints the Python and package versions, the allocator settings (PYTORCH_*_ALLOC_CONF;
expandable segments marked) and, for each known upstream bug, whether this environment
is affected and which patch handles it. Exit 1 when an affecting bug is left unhandled
(its patch disabled), 0 otherwise.""",
    "report": """usage: python -m shim report TRACE... [--plot OUT.png]

Per-process table of SHIM_TRACE files (run, start, rank, pid, engines, sleep/wake
cycles, sleeps, GiB freed per sleep, the smallest, ineffective sleeps, seconds asleep
and awake, the shim's own ms per sleep/wake call). Processes are told apart by host,
pid and start; concurrent or successive runs in one file are numbered apart. Lines
cut by a crash or that are not trace records are skipped and counted (exit 0).
  --plot OUT.png   device memory over time, one panel per run, one colour per rank
                   (needs matplotlib; any format matplotlib writes: .png, .svg, .pdf)""",
    "install": """usage: python -m shim install

Writes vllm_sleep_shim.pth (and the PEP 829 vllm_sleep_shim.start) into this
environment's site-packages: every interpreter of the environment activates the shim.""",
    "uninstall": """usage: python -m shim uninstall

Removes the files ``install`` wrote.""",
}


def _help(name: str, argv: list) -> bool:
    if "-h" in argv or "--help" in argv:
        print(USAGE[name])
        return True
    return False


def check_trace_path(path: str, option: str = "--trace") -> tuple:
    """``(absolute path, None)`` when ``path`` (``--trace`` / ``SHIM_TRACE``) can be appended to,
    else ``(None, one line saying why)``; ``("", None)`` for an empty value (no trace).

    ``option`` names where the path came from in the message (``--trace`` or ``SHIM_TRACE``).
    Relative paths are made absolute here, against the launcher's working directory, before
    any child changes directory. Appending is tried for real (a file this creates is removed
    again), so permissions, read-only file systems and missing directories are all caught."""
    if not path or not path.strip():
        return "", None
    what = f"{option} {path}" if option.startswith("-") else f"{option}={path}"
    full = os.path.abspath(os.path.expanduser(path.strip()))
    if os.path.isdir(full):
        return None, f"{what}: is a directory; give a file path (e.g. {os.path.join(path, 'trace.jsonl')})"
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        return None, f"{what}: directory {parent} does not exist"
    existed = os.path.exists(full)
    try:
        fd = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        return None, f"{what}: cannot write: {exc.strerror or exc}"
    os.close(fd)
    if not existed:
        try:
            os.remove(full)
        except OSError:
            pass
    return full, None


def _fail(message: str, code: int = 2) -> int:
    print(f"shim: {message}", file=sys.stderr)
    return code


def _table(rows: list, columns: list) -> str:
    widths = [max([len(str(c))] + [len(str(r.get(c) or "-")) for r in rows]) for c in columns]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(str(r.get(c) or "-").ljust(w) for c, w in zip(columns, widths)).rstrip())
    return "\n".join(lines)


def status(argv: list) -> int:
    if _help("status", argv):
        return 0
    unknown = [a for a in argv if a not in ("--json", "--import")]
    if unknown:
        return _fail(f"status: unknown argument {unknown[0]!r} (accepted: --json, --import)")
    import shim

    try:
        config.validate()
    except config.ConfigError as exc:
        return _fail(str(exc))
    shim.activate()
    patches = registry.all_patches()
    if "--import" in argv and shim.is_active():
        for patch in patches:
            if installed(patch.distribution) is None:
                continue
            try:
                importlib.import_module(patch.module)
            except Exception as exc:  # the row says why the hook never ran
                patching._decide(patch, patching.STAND_DOWN, f"cannot import {patch.module}: {type(exc).__name__}: {exc}")
    rows = patching.status_rows(patches)
    if "--json" in argv:
        print(json.dumps([{k: r[k] for k in ("id", "distribution", "installed", "affected", "decision", "reason")} for r in rows], indent=2))
        return 0
    for r in rows:
        r["decision "] = f"{r['decision']}: {r['reason']}" if r["reason"] else r["decision"]
    print(_table(rows, ["id", "issue", "distribution", "installed", "affected", "decision "]))
    return 0


def _torch_device() -> str:
    if installed("torch") is None:
        return "none"
    try:
        import torch
    except Exception as exc:
        return f"unusable ({type(exc).__name__})"
    try:
        if torch.cuda.is_available():
            return "cuda"
        if hasattr(torch, "npu") and torch.npu.is_available():
            return "npu"
    except Exception:
        pass
    return "none"


def doctor(argv: list) -> int:
    if _help("doctor", argv):
        return 0
    if argv:
        return _fail(f"doctor: unknown argument {argv[0]!r}")
    print(f"python       {sys.version.split()[0]}")
    for dist in DISTRIBUTIONS:
        extra = f"  (device: {_torch_device()})" if dist == "torch" else ""
        print(f"{dist:<12} {installed(dist) or 'not installed'}{extra}")
    print("allocator:")
    for var in ALLOC_VARS:
        value = os.environ.get(var)
        on = value is not None and "expandable_segments:true" in value.replace(" ", "").lower()
        print(f"  {var:<24} {value if value is not None else 'unset'}{'  <- expandable segments ON' if on else ''}")
    try:
        off_all = config.disabled()
        off, unknown = config.disabled_patches(registry.ids(), registry.removed())
    except config.ConfigError as exc:
        return _fail(str(exc))
    if unknown:
        print(f"  note: {config.SHIM_DISABLED_PATCHES} names unknown id(s) {', '.join(unknown)} (ignored)")
    foreign = _foreign_shim()
    if foreign:
        print(f"WARNING: in {os.getcwd()} `import shim` resolves to {foreign}, not this package; "
              f"launch with `vllm-sleep-shim ...` and rename that file")
    always_on = _always_on()
    print(f"activation:  {always_on or 'not always on here (no vllm_sleep_shim.pth in ' + _site_packages() + ')'}")
    print("known bugs:")
    unhandled, manual = [], []
    patches = registry.all_patches()
    features = [p for p in patches if p.issue == FEATURE]
    for patch in patches:
        if patch in features:
            continue
        version = installed(patch.distribution)
        if version is None or not in_range(version, patch.affected):
            print(f"  {patch.issue:<28} not affected ({patch.distribution} {version or 'not installed'})")
            continue
        if off_all or patch.id in off:
            unhandled.append(patch)
            why = config.SHIM_DISABLED if off_all else f"patch {patch.id} is disabled"
            print(f"  {patch.issue:<28} AFFECTED ({patch.distribution} {version}); {why}")
        elif always_on:
            print(f"  {patch.issue:<28} affected ({patch.distribution} {version}); fixed by patch {patch.id} (always on)")
        else:
            manual.append(patch)
            print(f"  {patch.issue:<28} AFFECTED ({patch.distribution} {version}); fixed by patch {patch.id} only in "
                  f"processes started with `vllm-sleep-shim CMD` / `python -m shim CMD` or that `import shim.auto`")
    if features:
        print("features:")
    for patch in features:
        state = "off (disabled)" if off_all or patch.id in off else (
            "on (always on)" if always_on else "on in processes the shim is active in")
        print(f"  {patch.id:<28} {state}: {patch.summary}")
    if unhandled or manual:
        bad = unhandled + manual
        print(f"doctor: {len(bad)} known bug(s) affect this environment and are not fixed in every process: "
              f"{', '.join(dict.fromkeys(p.issue for p in bad))}")
        if manual and not unhandled:
            print("doctor: start training through the shim, or make it always on with `python -m shim install`")
        return 1
    print("doctor: nothing known-bad left unhandled")
    return 0


def _always_on() -> str:
    """How the shim reaches every interpreter here, or '' (the .pth start-up line, or this process
    started under the launcher's bootstrap)."""
    pth = os.path.join(_site_packages(), PTH_NAME + ".pth")
    if os.path.exists(pth):
        return f"always on ({pth})"
    return ""


def _foreign_shim() -> "str | None":
    """Where ``import shim`` goes for a script started in the working directory, when that is not
    this package (a ``shim.py`` or ``shim/`` beside the user's training script shadows it)."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec("shim", [os.getcwd()] + sys.path[1:])
    if spec is None or spec.origin is None:
        return None
    origin = os.path.realpath(spec.origin)
    if os.path.dirname(origin) == os.path.realpath(here):
        return None
    return origin


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def install(argv: list) -> int:
    if _help("install", argv):
        return 0
    if argv:
        return _fail(f"install: unknown argument {argv[0]!r}")
    site = _site_packages()
    pth = os.path.join(site, PTH_NAME + ".pth")
    start = os.path.join(site, PTH_NAME + ".start")
    try:
        with open(pth, "w") as f:
            f.write(PTH_LINE)
        with open(start, "w") as f:
            f.write("shim._startup:main\n")
    except OSError as exc:
        return _fail(f"install: cannot write to {site}: {exc}", 1)
    print(f"shim: wrote {pth} and {start}; every new interpreter of this environment activates the shim")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.realpath(here) != os.path.realpath(site):
        print(f"shim: note: shim is imported from {here}, not from {site}; `pip install` it there for the start-up line to find it")
    return 0


def uninstall(argv: list) -> int:
    if _help("uninstall", argv):
        return 0
    if argv:
        return _fail(f"uninstall: unknown argument {argv[0]!r}")
    site = _site_packages()
    removed = []
    for suffix in (".pth", ".start"):
        path = os.path.join(site, PTH_NAME + suffix)
        if os.path.exists(path):
            os.remove(path)
            removed.append(path)
    print(f"shim: removed {' and '.join(removed)}" if removed else f"shim: nothing to remove in {site}")
    return 0


def report(argv: list) -> int:
    """``report TRACE... [--plot OUT.png]``: per-process table of SHIM_TRACE recordings."""
    if _help("report", argv):
        return 0
    from shim import telemetry

    paths, out = [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--plot":
            if i + 1 >= len(argv):
                return _fail("report: --plot needs an output path (e.g. --plot memory.png)")
            out = argv[i + 1]
            i += 2
            continue
        if a.startswith("-"):
            return _fail(f"report: unknown option {a!r} (accepted: --plot OUT.png, --help)")
        paths.append(a)
        i += 1
    if not paths:
        return _fail("report: give one or more trace files (written with SHIM_TRACE=PATH)")
    try:
        trace = telemetry.read(paths)
    except telemetry.TraceError as exc:
        return _fail(f"report: {exc}", 1)
    if trace.skipped:
        shown = "; ".join(trace.skipped[:3]) + ("; ..." if len(trace.skipped) > 3 else "")
        print(f"shim: report: skipped {len(trace.skipped)} line(s) that are not whole trace records ({shown})",
              file=sys.stderr)
    if not trace.records:
        return _fail(f"report: no events in {', '.join(paths)}", 1)
    rows = telemetry.rows(trace)
    columns = ["run", "start", "rank", "pid"] + (["host"] if any("host" in r for r in rows) else []) + [
        "engines", "cycles", "sleeps", "GiB freed/sleep", "min GiB freed", "ineffective", "asleep s", "awake s",
        "shim ms/call"]
    print(_table([{k: str(v) for k, v in r.items()} for r in rows], columns))
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("report: --plot needs matplotlib (pip install matplotlib); the table above is complete", 1)
        if os.path.isdir(out):
            return _fail(f"report: cannot write the plot to {out}: is a directory; the table above is complete", 1)
        try:
            telemetry.plot(trace, out)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            return _fail(f"report: cannot write the plot to {out}: {why}; the table above is complete", 1)
        # matplotlib adds its default format's suffix to a name without one
        suffix = "" if os.path.splitext(out)[1] else "." + str(matplotlib.rcParams.get("savefig.format", "png"))
        print(f"shim: wrote {out}{suffix}")
    return 0
