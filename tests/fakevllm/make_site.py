"""Write a site directory holding the fake vllm for one version.

    python tests/fakevllm/make_site.py OUTDIR [--version 0.24.0] [--device cuda|npu]

OUTDIR gets symlinks to the fake ``vllm`` package (and, for --device npu, to
``vllm_ascend`` and ``torch_npu``) plus ``vllm-<version>.dist-info`` (METADATA,
top_level.txt, RECORD, INSTALLER), so ``importlib.metadata.version("vllm")``
and ``packages_distributions()`` answer like a real install.  Put OUTDIR on
PYTHONPATH (instead of tests/fakevllm) and export the matching
FAKEVLLM_VERSION / FAKEVLLM_DEVICE (``env_for`` returns them).
"""
from __future__ import annotations

import argparse
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))


def write_dist_info(outdir: str, version: str, name: str = "vllm", top: str = "vllm") -> str:
    d = os.path.join(outdir, f"{top}-{version}.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                f"Summary: CPU stand-in for {name} (vllm-sleep-shim tests)\n")
    with open(os.path.join(d, "top_level.txt"), "w") as f:
        f.write(top + "\n")
    with open(os.path.join(d, "INSTALLER"), "w") as f:
        f.write("fakevllm\n")
    with open(os.path.join(d, "RECORD"), "w") as f:
        f.write(f"{top}/__init__.py,,\n")
    return d


def make_site(outdir: str, version: str = "0.24.0", device: str = "cuda",
              ascend_version: str | None = None) -> str:
    os.makedirs(outdir, exist_ok=True)
    for entry in os.listdir(outdir):
        if entry.endswith(".dist-info") or entry in ("vllm", "vllm_ascend", "torch_npu"):
            p = os.path.join(outdir, entry)
            if os.path.islink(p) or os.path.isfile(p):
                os.unlink(p)
            else:
                shutil.rmtree(p)
    os.symlink(os.path.join(HERE, "vllm"), os.path.join(outdir, "vllm"))
    write_dist_info(outdir, version)
    if device == "npu":
        os.symlink(os.path.join(HERE, "npu", "vllm_ascend"), os.path.join(outdir, "vllm_ascend"))
        os.symlink(os.path.join(HERE, "npu", "torch_npu"), os.path.join(outdir, "torch_npu"))
        write_dist_info(outdir, ascend_version or "0.13.0rc1", name="vllm-ascend", top="vllm_ascend")
        write_dist_info(outdir, "2.7.1", name="torch-npu", top="torch_npu")
    return outdir


def env_for(outdir: str, version: str = "0.24.0", device: str = "cuda", base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([outdir] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["FAKEVLLM_VERSION"] = version
    env["FAKEVLLM_DEVICE"] = device
    return env


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--version", default="0.24.0")
    ap.add_argument("--device", default="cuda", choices=["cuda", "npu"])
    ap.add_argument("--ascend-version", default=None)
    a = ap.parse_args()
    print(make_site(a.outdir, a.version, a.device, a.ascend_version))
