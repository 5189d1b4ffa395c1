"""The launcher: ``python -m shim [OPTIONS] [--] COMMAND [ARGS...]`` execs COMMAND with the bootstrap
directory (``shim/_bootstrap``, a ``sitecustomize`` that chains the user's) first on PYTHONPATH, so
COMMAND and every Python process it starts (torchrun ranks, spawned workers) turn the shim on."""
from __future__ import annotations

import os
import shutil
import sys

from shim.cli.common import SUBCOMMANDS, check_trace_path, fail
from shim.engine import catalog, config

_RUN_OPTIONS = {"--trace": "SHIM_TRACE", "--disable": "SHIM_DISABLED_PATCHES"}
_RUN_FLAGS = {"--strict": "SHIM_STRICT", "--debug": "SHIM_DEBUG", "--verify-weights": "SHIM_VERIFY_WEIGHTS"}


def bootstrap_dir() -> str:
    from shim import bootstrap_dir as shared  # the same directory ``shim.activate`` puts on PYTHONPATH

    return shared()


def _subcommand_like(word: str, path: "str | None") -> "str | None":
    """The subcommand ``word`` is a typo of (``difflib`` ratio >= 0.75: ``stauts``, ``docter``, ``instal``),
    or None. A program on PATH or an existing file is never a typo: whatever it is named, it runs."""
    if os.sep in word or (os.altsep and os.altsep in word) or os.path.exists(word):
        return None
    if shutil.which(word, path=path) is not None:
        return None
    import difflib

    close = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1, cutoff=0.75)
    return close[0] if close else None


def run(argv: list, usage: str) -> int:
    """Exec COMMAND with the bootstrap directory first on PYTHONPATH."""
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
            return fail(f"unknown option {arg!r}\n{usage}")
    command = argv[i:]
    if not command:
        print(usage, file=sys.stderr)
        return 2
    if i == 0:  # ``python -m shim stauts``: a mistyped subcommand, not a program to look for
        suggestion = _subcommand_like(command[0], env.get("PATH"))
        if suggestion:
            return fail(f"unknown command {command[0]!r}; did you mean {suggestion!r}?")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:  # every switch of config.ALL, with the child's environment, before anything starts
        errors = config.problems()
        _, unknown = config.disabled_patches(catalog.ids(), catalog.removed(), catalog.bugs())
        reported = config.unknown_patches_reported()  # a launcher started by a launcher: warned already
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if errors:  # one line per bad switch; COMMAND never starts
        for exc in errors[:-1]:
            fail(str(exc))
        return fail(str(errors[-1]))
    if unknown and not reported:  # said once here; COMMAND and its children see the marker and stay silent
        print(f"shim: warning: {config.unknown_patches_warning(unknown, [*catalog.bugs(), *catalog.ids()])}", file=sys.stderr)
    if unknown:
        env[config.DISABLED_PATCHES_REPORTED] = env.get(config.SHIM_DISABLED_PATCHES, "")
    option = "--trace" if "--trace" in argv[:i] else config.SHIM_TRACE  # the path's origin, in the message
    trace, error = check_trace_path(env.get(config.SHIM_TRACE, ""), option)
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
