"""Mirrors vllm/distributed/weight_transfer (0.22+), names only."""
