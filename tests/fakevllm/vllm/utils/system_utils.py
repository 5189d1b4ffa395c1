"""Mirrors vllm/utils/system_utils.py ``get_mp_context`` (0.24): the multiprocessing context the
engine-core process is started with, ``VLLM_WORKER_MULTIPROC_METHOD`` (``spawn`` | ``fork``).

Upstream's default is ``fork`` (vllm/envs.py), but ``_maybe_force_spawn`` overrides it to ``spawn``
whenever CUDA is already initialized in the parent -- always the case in a trainer that holds its
model on the GPU (and in a Ray actor, under WSL, with NUMA binding). The fake device never
initializes CUDA, so the stand-in takes that trainer case as its default: ``spawn`` unless the
variable says ``fork``.
"""
from __future__ import annotations

import multiprocessing
import os


def get_mp_context():
    method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if method not in ("spawn", "fork"):
        raise ValueError(f"VLLM_WORKER_MULTIPROC_METHOD must be 'spawn' or 'fork', got {method!r}")
    return multiprocessing.get_context(method)
