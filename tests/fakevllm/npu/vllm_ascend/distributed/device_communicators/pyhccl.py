"""Mirrors vllm_ascend/distributed/device_communicators/pyhccl.py (name only)."""
from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator as PyHcclCommunicator  # noqa: F401
