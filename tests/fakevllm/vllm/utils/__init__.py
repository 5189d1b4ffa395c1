"""Mirrors vllm/utils/__init__.py (names TRL/ms-swift/OpenRLHF import)."""
import uuid

from vllm.utils.network_utils import get_distributed_init_method, get_ip, get_open_port  # noqa: F401

GiB_bytes = 1 << 30


def is_pin_memory_available() -> bool:
    return False


def random_uuid() -> str:
    return str(uuid.uuid4().hex)
