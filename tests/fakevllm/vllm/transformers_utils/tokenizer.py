"""Mirrors vllm/transformers_utils/tokenizer.py (get_tokenizer, get_cached_tokenizer)."""


def get_cached_tokenizer(tokenizer):
    return tokenizer


def get_tokenizer(name, *args, trust_remote_code=False, **kwargs):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
