"""A toy upstream package for the patch-engine tests (stands in for trl/vllm layout)."""
