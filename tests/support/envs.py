"""Per-version installs of TRL for the test suite (stdlib only).

``trl_path("1.9.2")`` installs ``trl==1.9.2`` once with
``pip install --no-deps --target <repo>/.envs/trl-1.9.2`` and returns that
directory; put it first on ``PYTHONPATH`` (or ``sys.path``) to test against that
release. Everything else TRL needs comes from tests/requirements.txt (one shared
environment serves every version listed in ``TRL_VERSIONS``).

The install goes to a temporary directory next to the target and is renamed into
place, under an exclusive file lock, so concurrent pytest workers do not race.
An existing directory is used as is: no network.

Command line::

    python -m tests.support.envs trl 1.9.2 0.25.1 ...   # prebuild, prints one dir per line
    python -m tests.support.envs trl all                # every version in TRL_VERSIONS
    python -m tests.support.envs all                    # same ("trl" is optional)
    python -m tests.support.envs triton                 # Triton for the digest kernel's CPU interpreter
    python -m tests.support.envs verl 0.7.1 0.8.0 ...   # verl releases (+ the packages its rollout imports)
    python -m tests.support.envs verl all               # every version in VERL_VERSIONS
    python -m tests.support.envs openrlhf all           # OpenRLHF releases (+ what its vLLM engine module imports)
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

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ENVS_DIR = REPO_ROOT / ".envs"

# Releases the suite covers (latest patch of each minor with vLLM colocate + sleep
# mode, plus the boundaries of the bugs: 0.29.0 added the wake in sync_weights,
# 1.9.2 is the last with #5312, 1.10.0 has the upstream fix).
TRL_VERSIONS: tuple[str, ...] = (
    "0.23.1",
    "0.24.0",
    "0.25.1",
    "0.26.2",
    "0.27.2",
    "0.28.0",
    "0.29.0",
    "0.29.1",
    "1.0.0",
    "1.9.2",
    "1.10.0",
    "1.16.0",
)

# Extra requirements installed into the same --target dir for a given version
# (e.g. a transformers pin). Empty: tests/requirements.txt serves all of them.
TRL_EXTRAS: dict[str, tuple[str, ...]] = {}

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+){1,3}([a-z]+[0-9]+)?(\.post[0-9]+)?$")


class EnvError(Exception):
    """Bad input or failed install; str() is one line."""


def _check_version(version: str) -> str:
    if not isinstance(version, str) or not _VERSION_RE.match(version.strip()):
        raise EnvError(f"invalid TRL version {version!r} (expected e.g. 1.9.2)")
    return version.strip()


class _FileLock:
    """Exclusive lock on a file (fcntl on POSIX, msvcrt elsewhere)."""

    def __init__(self, path: pathlib.Path, timeout: float = 1800.0):
        self.path = path
        self.timeout = timeout
        self._fh = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a+")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if os.name == "nt":  # pragma: no cover
                    import msvcrt

                    msvcrt.locking(self._fh.fileno(), msvcrt.LK_NBLCK, 1)
                else:
                    import fcntl

                    fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self._fh.close()
                    raise EnvError(f"timed out waiting for lock {self.path}")
                time.sleep(0.2)

    def __exit__(self, *exc):
        try:
            if os.name == "nt":  # pragma: no cover
                import msvcrt

                msvcrt.locking(self._fh.fileno(), msvcrt.LK_UNLCK, 1)
            else:
                import fcntl

                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        finally:
            self._fh.close()
        return False


TRITON_VERSION = "3.6.0"
"""The Triton release whose interpreter (``TRITON_INTERPRET=1``, CPU) runs the digest kernel in the tests
(the H200 machine's, ../shared/gpu/h200_piplist.txt)."""


def _ready(path: pathlib.Path, package: str = "trl") -> bool:
    return (path / package / "__init__.py").is_file()


def _install(dest: pathlib.Path, requirements: list[str], package: str = "trl", drop: tuple = ()) -> None:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        cmd = [
            sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
            "--disable-pip-version-check", "--quiet", "--target", str(tmp), *requirements,
        ]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and "is ignored" not in ln]
            last = lines[-1] if lines else f"exit {proc.returncode}"
            raise EnvError(f"pip install {' '.join(requirements)} failed: {last.strip()}")
        if not (tmp / package / "__init__.py").is_file():
            raise EnvError(f"pip install {' '.join(requirements)} produced no {package} package")
        for name in drop:
            shutil.rmtree(tmp / name, ignore_errors=True)
        if dest.exists():  # stale, incomplete dir from an older run
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _cached(dest: pathlib.Path, requirements: list, package: str = "trl", drop: tuple = ()) -> pathlib.Path:
    """``dest``, installing ``requirements`` there first (once, under an exclusive lock) unless ``package`` is in it."""
    if _ready(dest, package):
        return dest
    ENVS_DIR.mkdir(parents=True, exist_ok=True)
    with _FileLock(ENVS_DIR / f".{dest.name}.lock"):
        if not _ready(dest, package):
            _install(dest, requirements, package, drop)
    return dest


def trl_path(version: str) -> pathlib.Path:
    """Return .envs/trl-<version>, installing trl==<version> there first if needed."""
    version = _check_version(version)
    dest = ENVS_DIR / f"trl-{version}"
    return _cached(dest, [f"trl=={version}", *TRL_EXTRAS.get(version, ())])


def triton_path() -> pathlib.Path:
    """Return .envs/triton-<TRITON_VERSION>, installing that Triton there (no deps) first if needed."""
    dest = ENVS_DIR / f"triton-{TRITON_VERSION}"
    return _cached(dest, [f"triton=={TRITON_VERSION}"], "triton")


VERL_VERSIONS: tuple[str, ...] = ("0.7.1", "0.8.0", "0.9.0", "0.9.1")
"""verl releases the suite covers: 0.7.1 and 0.8.0 sleep an MTP rollout at level 2 (verl#6661), 0.9.0 has the fix."""

VERL_DEPS: tuple[str, ...] = (
    # what ``import verl.workers.rollout.vllm_rollout.vllm_async_server`` needs (measured: each missing one is an
    # ImportError) beyond tests/requirements.txt; vLLM itself is the stand-in. ray is unavoidable: verl/__init__
    # imports verl.protocol, which imports ray (the wheel is 70 MB, 171 MB installed: most of this env).
    "ray==2.49.2", "msgpack==1.2.4", "protobuf==7.36.2", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0", "rpds-py==2026.9.1", "click==8.5.1", "cloudpickle==3.1.3",
    "tensordict==0.10.0", "pyvers==0.2.3", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "codetiming==1.4.0", "msgspec==0.23.0", "pyzmq==27.3.0", "orjson==3.13.0",
    # fastapi >= 0.13x imports opentelemetry; this pair does not
    "fastapi==0.115.12", "starlette==0.46.2", "uvicorn==0.54.0",
)
"""Installed once, with ``--no-deps``, into ``.envs/verl-deps-<hash of this list>``; every verl release shares it."""


def _check_verl_version(version: str) -> str:
    try:
        return _check_version(version)
    except EnvError:
        raise EnvError(f"invalid verl version {version!r} (expected e.g. 0.8.0)") from None


def verl_deps_path() -> pathlib.Path:
    """Return .envs/verl-deps-<hash>, installing :data:`VERL_DEPS` there (no deps) first if needed."""
    import hashlib

    dest = ENVS_DIR / f"verl-deps-{hashlib.sha1(' '.join(VERL_DEPS).encode()).hexdigest()[:8]}"
    return _cached(dest, list(VERL_DEPS), "ray")


def verl_path(version: str) -> pathlib.Path:
    """Return .envs/verl-<version>, installing verl==<version> there (no deps) first if needed. The wheel's
    top-level ``tests`` and ``scripts`` (verl's own suite) are removed: they would shadow this repository's
    ``tests``. Put :func:`verl_deps_path` on the path too."""
    version = _check_verl_version(version)
    dest = ENVS_DIR / f"verl-{version}"
    return _cached(dest, [f"verl=={version}"], "verl", drop=("tests", "scripts"))


def verl_paths(version: str) -> list:
    """The sys.path entries of verl ``version``: the release, then the shared packages it imports."""
    return [str(verl_path(version)), str(verl_deps_path())]


OPENRLHF_VERSIONS: tuple[str, ...] = ("0.11.2",)
"""OpenRLHF releases the suite covers (0.11.2 pins vllm 0.29.0, transformers 5.15.0, ray 2.55.0)."""

OPENRLHF_EXTRAS: tuple[str, ...] = ("pylatexenc==2.10",)
"""What ``import openrlhf.trainer.ray.vllm_engine`` needs beyond tests/requirements.txt and :func:`verl_deps_path`
(measured: each missing one is an ImportError): ``openrlhf.utils`` imports ``math_utils`` (sympy, from torch;
pylatexenc) and ``utils`` (torch, transformers), the engine module ``agent`` (aiohttp, from datasets' fsspec[http])
and ray. ray is the verl envs' 2.49.2, not OpenRLHF's pin 2.55.0: the module only decorates (``ray.remote``) and
names ``placement_group`` / ``PlacementGroupSchedulingStrategy`` / ``ray.get``, all the same in both, and the tests
start no Ray cluster. Installed with the release, ``--no-deps``, into ``.envs/openrlhf-<v>``."""


def _check_openrlhf_version(version: str) -> str:
    try:
        return _check_version(version)
    except EnvError:
        raise EnvError(f"invalid OpenRLHF version {version!r} (expected e.g. 0.11.2)") from None


def openrlhf_path(version: str) -> pathlib.Path:
    """Return .envs/openrlhf-<version>, installing openrlhf==<version> and :data:`OPENRLHF_EXTRAS` there (no deps)
    first if needed. The wheel's top-level ``tests`` (OpenRLHF's own suite) is removed: it would shadow this
    repository's ``tests``."""
    version = _check_openrlhf_version(version)
    dest = ENVS_DIR / f"openrlhf-{version}"
    return _cached(dest, [f"openrlhf=={version}", *OPENRLHF_EXTRAS], "openrlhf", drop=("tests",))


def openrlhf_paths(version: str) -> list:
    """The sys.path entries of OpenRLHF ``version``: the release, then the verl envs' shared packages (ray)."""
    return [str(openrlhf_path(version)), str(verl_deps_path())]


def build_cli(argv: list, usage: str, all_versions, check, build) -> int:
    """The command line of the env builders (this module, ``tests.support.swift_envs``): ``VERSION ... | all``.
    Every version is checked before any is built; one path per version on stdout; a bad version
    or a failed build is one line on stderr and exit 1, bad usage exit 2."""
    if not argv or any(a.startswith("-") for a in argv):
        print(usage, file=sys.stderr)
        return 2
    versions = list(all_versions) if argv == ["all"] else argv
    try:
        for v in versions:
            check(v)
        for v in versions:
            print(build(v), flush=True)
    except EnvError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m tests.support.envs [trl] VERSION [VERSION ...] | python -m tests.support.envs [trl] all"
    if argv == ["triton"]:
        try:
            print(triton_path())
        except EnvError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    ray_kinds = {"verl": (VERL_VERSIONS, _check_verl_version, verl_path),
                 "openrlhf": (OPENRLHF_VERSIONS, _check_openrlhf_version, openrlhf_path)}
    if argv[:1] and argv[0] in ray_kinds:  # both on the verl envs' shared packages (ray)
        versions, check, build = ray_kinds[argv[0]]
        usage = f"usage: python -m tests.support.envs {argv[0]} VERSION [VERSION ...] | all"
        if argv[1:]:
            try:
                print(verl_deps_path(), flush=True)
            except EnvError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
        return build_cli(argv[1:], usage, versions, check, build)
    if argv[:1] == ["trl"]:
        argv = argv[1:]
    return build_cli(argv, usage, TRL_VERSIONS, _check_version, trl_path)


if __name__ == "__main__":
    sys.exit(main())
