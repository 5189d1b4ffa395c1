"""Mirrors vllm/entrypoints/openai/api_server.py by name only: ``build_app`` and ``init_app_state``, which
verl's ``vllm_async_server`` imports at import time. The OpenAI server is not simulated: calling either raises."""


def build_app(args, *a, **kw):
    raise NotImplementedError("the vLLM stand-in has no OpenAI server")


async def init_app_state(engine_client, *a, **kw):
    raise NotImplementedError("the vLLM stand-in has no OpenAI server")
