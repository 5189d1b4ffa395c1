"""Mirrors vllm/utils/network_utils.py (get_open_port, get_ip)."""
import socket


def get_open_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_ip() -> str:
    return "127.0.0.1"


def get_distributed_init_method(ip: str, port: int) -> str:
    return f"tcp://{ip}:{port}"
