"""Mirrors vllm/entrypoints/cli/serve.py by name only: ``cmd_init`` and ``run_headless``, which verl's
``vllm_async_server`` imports at import time. Server mode is not simulated: calling either raises."""


def cmd_init():
    raise NotImplementedError("the vLLM stand-in does not run `vllm serve`")


def run_headless(args) -> None:
    raise NotImplementedError("the vLLM stand-in does not run headless engines")
