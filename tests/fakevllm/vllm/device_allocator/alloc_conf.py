"""Mirrors vllm/device_allocator/alloc_conf.py (added in vLLM 0.31.0, the same in 0.33.0 and 0.34.0; absent in 0.30.0):
reading and rewriting PyTorch's allocator config as a whole string.

Torch parses the config as a whole and resets the options a string leaves out (the stand-in's device
models that, ``vllm._fake.device``), so vLLM flips one field and writes the entire string back. The live
config is what the allocator last parsed (upstream: the ``allocator_settings`` of
``torch.cuda.memory._snapshot()``; the stand-in: ``DEVICE.last_conf``), with the environment as the
fallback, in torch's order: ``PYTORCH_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_HIP_ALLOC_CONF``.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from vllm import _fake

if _fake.V < _fake.Version("0.31.0"):
    raise ModuleNotFoundError(f"No module named 'vllm.device_allocator.alloc_conf' (vLLM {_fake.VERSION})",
                              name="vllm.device_allocator.alloc_conf")

ALLOC_CONF_ENV_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
EXPANDABLE_SEGMENTS = "expandable_segments"


def alloc_conf_from_env(environ=None) -> str:
    env = os.environ if environ is None else environ
    return next((env[name] for name in ALLOC_CONF_ENV_VARS if env.get(name)), "")


def live_alloc_conf() -> "str | None":
    from vllm._fake.device import DEVICE

    if not DEVICE._initialised:  # nothing parsed yet: the snapshot has no settings to report
        return None
    return DEVICE.last_conf


def current_alloc_conf() -> str:
    live = live_alloc_conf()
    return alloc_conf_from_env() if live is None else live


def conf_flag_enabled(conf: str, key: str) -> bool:
    for item in conf.split(","):
        name, _, value = item.partition(":")
        if name.strip() == key:
            return value.strip().lower() in ("true", "1")
    return False


def with_conf_flag(conf: str, key: str, enabled: bool) -> str:
    """``conf`` with ``key`` alone set (appended when absent), every other item as it was."""
    want = f"{key}:{enabled}"
    items = [item.strip() for item in conf.split(",") if item.strip()]
    for i, item in enumerate(items):
        if item.partition(":")[0].strip() == key:
            items[i] = want
            return ",".join(items)
    return ",".join(items + [want])


def set_alloc_conf(conf: str) -> None:
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # first, as upstream
    (setter or torch.cuda.memory._set_allocator_settings)(conf)


@contextmanager
def non_expandable_allocations():
    conf = current_alloc_conf()
    if not conf_flag_enabled(conf, EXPANDABLE_SEGMENTS):
        yield
        return
    set_alloc_conf(with_conf_flag(conf, EXPANDABLE_SEGMENTS, False))
    try:
        yield
    finally:
        set_alloc_conf(conf)


if _fake.V < _fake.Version("0.33.0"):  # in the 0.33.0 wheel (parallel_state.py's user), not in 0.31.0
    del non_expandable_allocations
