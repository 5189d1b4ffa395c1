"""Mirrors vllm/inputs (``TokensPrompt`` / ``TextPrompt``: the typed dicts a prompt is given as)."""
from typing import Any, TypedDict


class TextPrompt(TypedDict, total=False):
    prompt: str
    multi_modal_data: Any


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list
    multi_modal_data: Any
