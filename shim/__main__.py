"""``python -m shim`` (or the ``vllm-sleep-shim`` console script): run a command with the shim, or inspect it."""
from __future__ import annotations

import sys

USAGE = """usage:
    python -m shim [OPTIONS] [--] COMMAND [ARGS...]   run COMMAND (and every process it starts) with the shim
    python -m shim status [--all] [--sites] [--json] [--import]  one row per bug installed here
    python -m shim doctor                              versions, allocator settings, known bugs
    python -m shim install | uninstall                 always on / off for this environment
    python -m shim report TRACE... [--plot OUT.png]    sleep/wake table per process and run from SHIM_TRACE files

OPTIONS: --trace PATH (SHIM_TRACE), --disable ID[,ID] (SHIM_DISABLED_PATCHES),
--strict (SHIM_STRICT=1), --debug (SHIM_DEBUG=1), --verify-weights (SHIM_VERIFY_WEIGHTS=1). A command named like a
subcommand goes after ``--``.
``vllm-sleep-shim`` is the same launcher as a console script: no file in the working
directory (a ``shim.py``) can shadow it."""
"""Kept out of ``__doc__``: ``python -OO`` drops docstrings."""


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "--version":
        from shim import __version__

        print(__version__)
        return 0
    import importlib

    from shim.cli.common import SUBCOMMANDS

    if argv[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[argv[0]]
        return getattr(importlib.import_module(module), function)(argv[1:])
    from shim.cli.run import run

    return run(argv, USAGE)


if __name__ == "__main__":
    sys.exit(main())
