"""Real vllm-ascend source files for the stand-in's NPU mode (stdlib only).

``worker_source("0.23.0")`` downloads the vllm-ascend 0.23.0 wheel once (``pip download --no-deps
--only-binary :all:``), keeps only ``vllm_ascend/worker/worker.py`` from it under
``<repo>/.envs/vllm-ascend-0.23.0/`` and returns that file's path; the stand-in runs its
``NPUWorker.wake_up`` when ``FAKEVLLM_ASCEND_WORKER_SRC`` names it (tests/fakevllm: ``vllm._fake.real_code``).
The module itself cannot be imported on CPU (torch_npu's CANN extensions, vLLM internals). Under an
exclusive file lock, renamed into place: concurrent pytest workers do not race; an existing file is used
as is (no network). Releases on the index as wheels: up to 0.26.0rc1 (later ones are sdists only).

    python -m tests.support.ascend_src 0.13.0 0.23.0 ...   # prefetch, prints one path per line
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

from tests.support.envs import ENVS_DIR, EnvError, _FileLock

WORKER = "vllm_ascend/worker/worker.py"
VERSIONS = ("0.13.0", "0.23.0", "0.25.1rc1", "0.26.0rc1")
"""What the tests read: the first release with ``vllm_ascend/worker/worker.py``, the one the issues name,
the last before PR #13012, the first with it."""


def worker_source(version: str) -> str:
    dest = ENVS_DIR / f"vllm-ascend-{version}" / WORKER
    if dest.is_file():
        return str(dest)
    ENVS_DIR.mkdir(parents=True, exist_ok=True)
    with _FileLock(ENVS_DIR / f".vllm-ascend-{version}.lock"):
        if not dest.is_file():
            _fetch(version, dest)
    return str(dest)


def _fetch(version: str, dest: pathlib.Path) -> None:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".vllm-ascend-{version}.tmp-", dir=ENVS_DIR))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "-d", str(tmp), f"vllm-ascend=={version}"]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wheels = list(tmp.glob("vllm_ascend-*.whl"))
        if proc.returncode != 0 or not wheels:
            lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and "is ignored" not in ln]
            raise EnvError(f"pip download vllm-ascend=={version} failed: {(lines or ['no wheel'])[-1].strip()}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            data = wheel.read(WORKER)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".py.part")
        part.write_bytes(data)
        os.replace(part, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    for v in sys.argv[1:] or VERSIONS:
        print(worker_source(v))
