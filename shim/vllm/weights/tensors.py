"""What the weight fixes read off a vLLM model, in one place: its attention layers and the plain
tensors its modules hold.

``shim.vllm.weights.buffers`` keeps plain tensors across a level-2 sleep and
``shim.vllm.weights.reload`` re-derives them after a push; both find them here
(:func:`plain_tensors`, :func:`attention_classes`), and the flag a push leaves on the model
(:data:`REPROCESSED`) is read here too, so neither of the two imports the other.
"""
from __future__ import annotations

REPROCESSED = "_shim_pushes_reprocess"
"""Model attribute: a push into this model re-ran its attention layers' post-processing (``buffers``
reads it: the next push derives those layers' plain tensors again)."""


def attention_classes() -> tuple:
    """vLLM's attention layer classes (``Attention``, ``MLAAttention``); () where this vLLM has another
    layout (no attention layer is told apart) or cannot be imported."""
    try:
        from vllm.model_executor.layers.attention import Attention, MLAAttention
    except Exception:
        return ()
    return Attention, MLAAttention


def pushes_reprocess(model) -> bool:
    """Whether a push into ``model`` re-ran its attention layers' post-processing (a session ran on it)."""
    return bool(vars(model).get(REPROCESSED, False))


def _holders(model):
    """``(owner, attention?)`` for every module of ``model`` and the backend object it keeps as ``impl``."""
    import torch

    attention = attention_classes()
    for module in model.modules():
        is_attention = bool(attention) and isinstance(module, attention)
        yield module, is_attention
        impl = vars(module).get("impl")
        if impl is not None and not isinstance(impl, torch.nn.Module) and hasattr(impl, "__dict__"):
            yield impl, is_attention


def plain_tensors(model):
    """``(owner, name, tensor, attention?)`` for each plain tensor attribute of ``model``'s modules and
    their ``impl`` objects (what sits in ``vars(owner)``: parameters and buffers live in their own dicts)."""
    import torch

    for owner, is_attention in _holders(model):
        for name, value in list(vars(owner).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                yield owner, name, value, is_attention
