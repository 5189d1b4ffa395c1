"""``python -m shim install`` / ``uninstall``: the start-up line that makes the shim always on in an environment."""
from __future__ import annotations

import os
import sysconfig

from shim.cli.common import fail, help_asked

PTH_NAME = "vllm_sleep_shim"
PTH_LINE = (
    "import sys; exec('try:\\n import shim._startup as s; s.main()\\nexcept Exception as e:\\n"
    " print(\"[shim] ERROR start-up: %r\" % (e,), file=sys.stderr)')\n"
)


def site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def always_on() -> str:
    """How the shim reaches every interpreter here (the .pth start-up line), or ''. The launcher and
    ``import shim.auto`` reach one process tree: ``python -m shim doctor`` tells those apart."""
    pth = os.path.join(site_packages(), PTH_NAME + ".pth")
    if os.path.exists(pth):
        return f"always on ({pth})"
    return ""


def install(argv: list) -> int:
    if help_asked("install", argv):
        return 0
    if argv:
        return fail(f"install: unknown argument {argv[0]!r}")
    site = site_packages()
    pth = os.path.join(site, PTH_NAME + ".pth")
    start = os.path.join(site, PTH_NAME + ".start")
    try:
        with open(pth, "w") as f:
            f.write(PTH_LINE)
        with open(start, "w") as f:
            f.write("shim._startup:main\n")
    except OSError as exc:
        return fail(f"install: cannot write to {site}: {exc}", 1)
    print(f"shim: wrote {pth} and {start}; every new interpreter of this environment activates the shim")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where shim/ sits
    if os.path.realpath(here) != os.path.realpath(site):
        print(f"shim: note: shim is imported from {here}, not from {site}; `pip install` it there for the start-up line to find it")
    return 0


def uninstall(argv: list) -> int:
    if help_asked("uninstall", argv):
        return 0
    if argv:
        return fail(f"uninstall: unknown argument {argv[0]!r}")
    site = site_packages()
    removed = []
    for suffix in (".pth", ".start"):
        path = os.path.join(site, PTH_NAME + suffix)
        if os.path.exists(path):
            os.remove(path)
            removed.append(path)
    print(f"shim: removed {' and '.join(removed)}" if removed else f"shim: nothing to remove in {site}")
    return 0
