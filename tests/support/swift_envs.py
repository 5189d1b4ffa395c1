"""Per-version ms-swift virtual environments for the test suite (stdlib only).

``swift_python("3.10.1")`` returns ``<repo>/.envs/swift-3.10.1/bin/python``,
building that venv first if needed. Run tests in a fresh subprocess with that
interpreter and ``PYTHONPATH=<repo>`` (the shim under test is the working tree,
never pip-installed into these venvs).

What goes in (a MINIMAL install, pinned by ``tests/swift-constraints-<series>.txt``):

1. ``torch==2.13.0`` first (the CPU wheel; the constraints pin it too, so no
   later step can resolve a CUDA build);
2. ``ms-swift==<ver>`` with ``--no-deps`` (its full dependency set is ~0.5 GB of
   gradio, tensorboard, nltk, ... that no test touches);
3. what the tests import: transformers/trl/peft/accelerate/datasets at the
   versions ms-swift requires, modelscope, pydantic, pillow, einops, json_repair,
   dacite; ``msgspec`` (every version: the rollout mixin's utils import it) and
   ``math_verify`` (3.10.x: ``swift.plugin.orm`` asserts it at import);
   ``deepspeed`` (CPU build, ``DS_BUILD_OPS=0``, ``--no-build-isolation``) for
   the GKD ZeRO-3 teacher load; ``wrapt`` for the shim; 4.x also ``megatron-core``
   (a 2.6 MB wheel, no dependencies beyond the venv's) for ``swift.megatron.trainers.rollout_mixin``.

Enough to import ``swift.trainers.rlhf_trainer.rollout_mixin`` (3.10.x) /
``swift.rlhf_trainers.rollout_mixin`` (4.x), the GRPO/GKD trainers and
``SwiftRLHF``. Not ``mcore-bridge`` (ms-swift's other ``megatron`` extra): it
hard-imports ``transformer_engine``, which has no CPU build (the Megatron tests
put a names-only stand-in for it in ``sys.modules``). Not vLLM: tests put ``tests/fakevllm`` on PYTHONPATH when they
need it (3.10.x: use the fake at 0.10.2, TRL 0.24 imports ``GuidedDecodingParams``).
``pip check`` fails in these venvs (the skipped ms-swift deps): expected.

The venv is built in a temporary directory next to the target, under an
exclusive file lock, then renamed into place (console-script shebangs are
rewritten to the final path). An existing venv whose ``.complete`` marker
lists the current recipe is used as is: no network. A venv built by an older
recipe of the same release (its marker names fewer ``_ADDED`` packages) gets
only the missing packages installed in place, then a new marker.

Command line::

    python -m tests.support.swift_envs 3.10.1 4.6.0     # build (if needed), print each python path
    python -m tests.support.swift_envs all              # every version in SWIFT_VERSIONS
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tests.support.envs import EnvError, _FileLock, build_cli

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS_DIR = REPO_ROOT / "tests"
ENVS_DIR = REPO_ROOT / ".envs"

SWIFT_VERSIONS: tuple[str, ...] = ("3.10.0", "3.10.1", "4.6.0", "3.9.3", "3.11.1", "3.12.3", "4.5.3")

# Releases tested as an OVERLAY on the venv of a release with the same dependency pins: ms-swift (and
# the pins that differ) installed with ``pip install --no-deps --target .envs/swift-<ver>-overlay``,
# put on PYTHONPATH before the base venv's site-packages (``swift_pythonpath``); a few seconds and
# ~7 MB instead of a venv build. version -> (base release, extra pinned requirements).
OVERLAYS = {
    "3.9.3": ("3.10.1", ("trl==0.23.1",)),  # 3.9.x declares trl<0.24; transformers/peft pins as 3.10.x
    "3.11.1": ("3.10.1", ()),  # 3.11.x declares peft<0.19, transformers<4.58, trl<0.25: 3.10.x's pins fit
    "3.12.3": ("3.10.1", ()),  # 3.12.x declares peft<0.19, transformers<4.58, trl<0.25: 3.10.x's pins fit
    # 4.5.3 declares transformers<5.17 (4.6.0: <5.20; the venv has 5.19.0); its other pins (trl<1.0, peft<0.21,
    # datasets<4.8.5) fit 4.6.0's. transformers 5.16.1 needs huggingface-hub>=1.5,<2 and tokenizers>=0.23.1,<0.24:
    # the venv's 1.33.0 / 0.23.3.
    "4.5.3": ("4.6.0", ("transformers==5.16.1",)),
}

_COMMON = ("accelerate", "modelscope", "pydantic", "pillow", "einops", "json_repair", "dacite",
           "msgspec", "deepspeed", "wrapt")
# series -> (constraints file, packages beyond _COMMON). Every version is pinned by the file.
_SERIES = {
    "3.10": ("swift-constraints-3.10.x.txt",
             ("transformers", "trl", "peft", "datasets", "math_verify")),
    "4.6": ("swift-constraints-4.6.0.txt",
            ("transformers", "trl", "peft", "datasets", "megatron-core")),
}
# series -> packages added after venvs of that series were first built and cached. Each is named in
# the venv's marker; a cached venv whose marker lacks one gets it installed in place (_upgrade),
# instead of a rebuild. Append here whenever a series' package list grows.
_ADDED = {
    "4.6": ("megatron-core",),  # swift.megatron.trainers.rollout_mixin (tests/patches/swift_expandable_segments/test_swift_megatron.py)
}
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_MARKER = ".complete"


def _series(version: str) -> tuple:
    if not isinstance(version, str) or not _VERSION_RE.match(version.strip()):
        raise EnvError(f"invalid ms-swift version {version!r} (expected e.g. 3.10.1)")
    if version.strip() in OVERLAYS:
        return _series(OVERLAYS[version.strip()][0])
    key = ".".join(version.strip().split(".")[:2])
    if key not in _SERIES:
        raise EnvError(f"ms-swift {version} has no constraints file (known series: {', '.join(_SERIES)})")
    return _SERIES[key]


def _python(venv: pathlib.Path) -> pathlib.Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _marker_text(version: str) -> str:
    key = ".".join(version.split(".")[:2])
    return f"ms-swift=={version}\n" + "".join(f"+{pkg}\n" for pkg in _ADDED.get(key, ()))


def _marker(venv: pathlib.Path) -> "str | None":
    try:
        return (venv / _MARKER).read_text()
    except OSError:
        return None


def _ready(venv: pathlib.Path, version: str) -> bool:
    return _marker(venv) == _marker_text(version) and _python(venv).exists()


def _upgradable(venv: pathlib.Path, version: str) -> bool:
    """A complete venv of this release from an older recipe: only _ADDED packages may be missing."""
    text = _marker(venv)
    return (text is not None and _python(venv).exists()
            and text.splitlines()[:1] == [f"ms-swift=={version}"])


def _pip_env() -> dict:
    env = dict(os.environ, DS_BUILD_OPS="0", PIP_NO_INPUT="1")
    env.pop("PYTHONPATH", None)
    return env


def _upgrade(version: str, venv: pathlib.Path, log=None) -> None:
    """Install the _ADDED packages into a cached venv of an older recipe (pinned, no deps changed)."""
    constraints, _ = _series(version)
    key = ".".join(version.split(".")[:2])
    have = set(_marker(venv).splitlines()[1:])
    missing = [pkg for pkg in _ADDED.get(key, ()) if f"+{pkg}" not in have]
    t0 = time.monotonic()
    if missing:
        _run([_python(venv), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile", "--quiet",
              "-c", TESTS_DIR / constraints, *missing], f"[swift {version}] pip install {' '.join(missing)}",
             env=_pip_env())
    (venv / _MARKER).write_text(_marker_text(version))
    if log:
        log(f"[swift {version}] added {', '.join(missing) or 'nothing'}: {time.monotonic() - t0:.0f} s")


def _run(cmd: list, what: str, env: dict | None = None) -> None:
    proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        tail = " | ".join(ln.strip() for ln in lines[-3:]) or f"exit {proc.returncode}"
        raise EnvError(f"{what} failed: {tail}")


def _fix_paths(venv: pathlib.Path, old: str) -> None:
    """After the rename: point console scripts and activate files at the final path."""
    bindir = venv / "bin"
    for f in bindir.iterdir():
        if f.is_symlink() or not f.is_file():
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if old in text:
            f.write_text(text.replace(old, str(venv)))


def _build(version: str, dest: pathlib.Path, log=None) -> None:
    constraints, extra = _series(version)
    constraints = TESTS_DIR / constraints
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        _run([sys.executable, "-m", "venv", tmp], "python -m venv")
        py = _python(tmp)
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-compile", "--quiet"]
        steps = [
            ("torch==2.13.0", [*pip, "torch==2.13.0"]),
            (f"ms-swift=={version} --no-deps", [*pip, "--no-deps", f"ms-swift=={version}"]),
            ("dependencies", [*pip, "--no-build-isolation", "-c", constraints, *_COMMON, *extra]),
        ]
        env = _pip_env()
        for what, cmd in steps:
            t0 = time.monotonic()
            _run(cmd, f"[swift {version}] pip install {what}", env=env)
            if log:
                log(f"[swift {version}] {what}: {time.monotonic() - t0:.0f} s")
        (tmp / _MARKER).write_text(_marker_text(version))
        if dest.exists():  # stale, incomplete venv from an interrupted run
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        _fix_paths(dest, str(tmp))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _overlay_marker(version: str) -> str:
    return f"ms-swift=={version}\n" + "".join(f"{req}\n" for req in OVERLAYS[version][1])


def swift_overlay(version: str, log=None) -> pathlib.Path:
    """Return .envs/swift-<version>-overlay (ms-swift <version> and OVERLAYS' pins, --no-deps --target),
    building it first if needed (its base venv too)."""
    base, extra = OVERLAYS[version]
    swift_env(base, log=log)
    dest = ENVS_DIR / f"swift-{version}-overlay"
    if (dest / _MARKER).is_file() and (dest / _MARKER).read_text() == _overlay_marker(version):
        return dest
    with _FileLock(ENVS_DIR / f".swift-{version}-overlay.lock", timeout=3600.0):
        if (dest / _MARKER).is_file() and (dest / _MARKER).read_text() == _overlay_marker(version):
            return dest
        t0 = time.monotonic()
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=ENVS_DIR))
        try:
            _run([_python(ENVS_DIR / f"swift-{base}"), "-m", "pip", "install", "--disable-pip-version-check",
                  "--no-compile", "--quiet", "--no-deps", "--target", tmp, f"ms-swift=={version}", *extra],
                 f"[swift {version}] pip install --target (overlay on {base})", env=_pip_env())
            for name in ("tests", "examples", "scripts", "bin"):  # ms-swift's wheel ships top-level `tests`
                shutil.rmtree(tmp / name, ignore_errors=True)
            (tmp / _MARKER).write_text(_overlay_marker(version))
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if log:
            log(f"[swift {version}] overlay on {base}: {time.monotonic() - t0:.0f} s")
    return dest


def swift_pythonpath(version: str) -> list:
    """Directories to put on PYTHONPATH (before the venv's site-packages) for ms-swift <version>."""
    return [str(swift_overlay(version.strip()))] if version.strip() in OVERLAYS else []


def swift_env(version: str, log=None) -> pathlib.Path:
    """Return .envs/swift-<version>, building it first if needed (for an overlay release: its base venv,
    and the overlay)."""
    _series(version)
    version = version.strip()
    if version in OVERLAYS:
        swift_overlay(version, log=log)
        return swift_env(OVERLAYS[version][0])
    dest = ENVS_DIR / f"swift-{version}"
    if _ready(dest, version):
        return dest
    ENVS_DIR.mkdir(parents=True, exist_ok=True)
    with _FileLock(ENVS_DIR / f".swift-{version}.lock", timeout=3600.0):
        if _ready(dest, version):
            pass
        elif _upgradable(dest, version):
            _upgrade(version, dest, log=log)
        else:
            _build(version, dest, log=log)
    return dest


def swift_python(version: str) -> pathlib.Path:
    """Path to the python of the ms-swift <version> test venv (built on first use)."""
    return _python(swift_env(version))


def _build_and_report(version: str) -> pathlib.Path:
    t0 = time.monotonic()
    python = _python(swift_env(version, log=lambda m: print(m, file=sys.stderr, flush=True)))
    print(f"[swift {version}] ready in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return python


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return build_cli(argv, "usage: python -m tests.support.swift_envs VERSION [VERSION ...] | all", SWIFT_VERSIONS,
                     _series, _build_and_report)

if __name__ == "__main__":
    sys.exit(main())
