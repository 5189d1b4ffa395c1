"""Subcommands of ``python -m shim``: status, doctor, install, uninstall, report."""
from __future__ import annotations

import importlib
import json
import os
import sys
import sysconfig

from shim import config, patching
from shim.versions import installed, in_range

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
DISTRIBUTIONS = ("torch", "vllm", "vllm-ascend", "trl", "ms-swift", "deepspeed", "wrapt")
PTH_NAME = "vllm_sleep_shim"
PTH_LINE = (
    "import sys; exec('try:\\n import shim._startup as s; s.main()\\nexcept Exception as e:\\n"
    " print(\"[shim] ERROR start-up: %r\" % (e,), file=sys.stderr)')\n"
)


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
    unknown = [a for a in argv if a not in ("--json", "--import")]
    if unknown:
        return _fail(f"status: unknown argument {unknown[0]!r} (accepted: --json, --import)")
    import shim

    try:
        config.validate([p.id for p in patching.all_patches()])
    except config.ConfigError as exc:
        return _fail(str(exc))
    shim.activate()
    if "--import" in argv:
        for patch in patching.all_patches():
            if installed(patch.distribution) is None:
                continue
            try:
                importlib.import_module(patch.module)
            except Exception as exc:  # the row says why the hook never ran
                patching._decide(patch, patching.STAND_DOWN, f"cannot import {patch.module}: {type(exc).__name__}: {exc}")
    rows = patching.status_rows()
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
        off = config.disabled_patches([p.id for p in patching.all_patches()])
    except config.ConfigError as exc:
        return _fail(str(exc))
    print("known bugs:")
    unhandled = []
    for patch in patching.all_patches():
        version = installed(patch.distribution)
        if version is None or not in_range(version, patch.affected):
            print(f"  {patch.issue:<28} not affected ({patch.distribution} {version or 'not installed'})")
            continue
        if off_all or patch.id in off:
            unhandled.append(patch)
            print(f"  {patch.issue:<28} AFFECTED ({patch.distribution} {version}); patch {patch.id} is disabled")
        else:
            print(f"  {patch.issue:<28} affected ({patch.distribution} {version}); fixed by patch {patch.id} when the shim is active")
    if unhandled:
        print(f"doctor: {len(unhandled)} known bug(s) not handled: {', '.join(p.issue for p in unhandled)}")
        return 1
    print("doctor: nothing known-bad left unhandled")
    return 0


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def install(argv: list) -> int:
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
    """``report TRACE... [--plot OUT.png]``: per-rank table of a SHIM_TRACE recording."""
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
            return _fail(f"report: unknown option {a!r} (accepted: --plot OUT.png)")
        paths.append(a)
        i += 1
    if not paths:
        return _fail("report: give one or more trace files (written with SHIM_TRACE=PATH)")
    try:
        records = telemetry.load(paths)
    except telemetry.TraceError as exc:
        return _fail(f"report: {exc}", 1)
    if not records:
        return _fail(f"report: no events in {', '.join(paths)}", 1)
    rows = telemetry.per_rank(records)
    columns = ["rank", "engines", "cycles", "sleeps", "GiB freed/sleep", "min GiB freed", "ineffective",
               "asleep s", "awake s", "shim ms/call"]
    print(_table([{k: str(v) for k, v in r.items()} for r in rows], columns))
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("report: --plot needs matplotlib (pip install matplotlib); the table above is complete", 1)
        telemetry.plot(records, out)
        print(f"shim: wrote {out}")
    return 0
