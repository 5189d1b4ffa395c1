"""``python -m shim`` (or the ``vllm-sleep-shim`` console script): run a command with the shim, or inspect it."""
from __future__ import annotations

import os
import shutil
import sys

USAGE = """usage:
    python -m shim [OPTIONS] [--] COMMAND [ARGS...]   run COMMAND (and every process it starts) with the shim
    python -m shim status [--json] [--import]         one row per patch and its decision
    python -m shim doctor                              versions, allocator settings, known bugs
    python -m shim install | uninstall                 always on / off for this environment
    python -m shim report TRACE... [--plot OUT.png]    sleep/wake table per process and run from SHIM_TRACE files

OPTIONS: --trace PATH (SHIM_TRACE), --disable ID[,ID] (SHIM_DISABLED_PATCHES),
--strict (SHIM_STRICT=1), --debug (SHIM_DEBUG=1), --verify-weights (SHIM_VERIFY_WEIGHTS=1). A command named like a
subcommand goes after ``--``.
``vllm-sleep-shim`` is the same launcher as a console script: no file in the working
directory (a ``shim.py``) can shadow it."""
"""Kept out of ``__doc__``: ``python -OO`` drops docstrings."""
SUBCOMMANDS = ("status", "doctor", "install", "uninstall", "report")
_RUN_OPTIONS = {"--trace": "SHIM_TRACE", "--disable": "SHIM_DISABLED_PATCHES"}
_RUN_FLAGS = {"--strict": "SHIM_STRICT", "--debug": "SHIM_DEBUG", "--verify-weights": "SHIM_VERIFY_WEIGHTS"}


def bootstrap_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def fail(message: str, code: int = 2) -> int:
    print(f"shim: {message}", file=sys.stderr)
    return code


def run(argv: list) -> int:
    """Exec COMMAND with the bootstrap directory first on PYTHONPATH."""
    from shim import config, registry

    env = dict(os.environ)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in _RUN_FLAGS:
            env[_RUN_FLAGS[arg]] = "1"
            i += 1
        elif arg in _RUN_OPTIONS:
            if i + 1 >= len(argv):
                return fail(f"{arg} needs a value")
            env[_RUN_OPTIONS[arg]] = argv[i + 1]
            i += 2
        else:
            return fail(f"unknown option {arg!r}\n{USAGE}")
    command = argv[i:]
    if not command:
        print(USAGE, file=sys.stderr)
        return 2
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:  # validate with the child's environment before anything starts
        config.validate()
        _, unknown = config.disabled_patches(registry.ids(), registry.removed())
    except config.ConfigError as exc:
        return fail(str(exc))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if unknown:
        print(f"shim: warning: {config.SHIM_DISABLED_PATCHES}: unknown patch id(s) {', '.join(unknown)} ignored; "
              f"valid ids: {', '.join(registry.ids())}", file=sys.stderr)
    from shim import cli

    trace, error = cli.check_trace_path(env.get(config.SHIM_TRACE, ""))
    if error:
        return fail(error)
    if trace:
        env[config.SHIM_TRACE] = trace  # absolute: children may change directory
    executable = shutil.which(command[0], path=env.get("PATH"))
    if executable is None:
        return fail(f"command not found: {command[0]}", 127)
    paths = [bootstrap_dir()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.execve(executable, command, env)
    return 0  # not reached


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
    if argv[0] in SUBCOMMANDS:
        from shim import cli

        return getattr(cli, argv[0])(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
