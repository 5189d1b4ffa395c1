"""Tiny local causal-LM checkpoints for the test suite (no hub access, ever).

``make_tiny_model(dir, seed=0, hidden=32, layers=2, ...)`` writes a random
Qwen2ForCausalLM (safetensors, float32) plus a local tokenizer built with the
``tokenizers`` library (byte-level BPE trained on a small fixed word list), wrapped as PreTrainedTokenizerFast with pad/eos tokens and
a simple chat template.  ``wide=True`` makes the weights bigger
(hidden 256, intermediate 1024, vocab unchanged).
``make_tiny_mla_model(dir, seed=0)`` writes a random DeepseekV2ForCausalLM (multi-head latent
attention, dense MLPs only) with the same tokenizer.
"""
from __future__ import annotations

import json
import os

WORDS = ("the a an is are was be to of and in on at for with by from it this that "
         "one two three four five six seven eight nine ten zero plus minus times equals "
         "yes no true false answer question what which who how why when where "
         "cat dog bird fish tree sun moon star sky sea red blue green black white "
         "big small good bad fast slow up down left right hot cold new old "
         "user assistant system hello world think step so then because").split()
SPECIAL = ["<pad>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}"
)


def make_tokenizer(out_dir: str | None = None):
    """Byte-level BPE (GPT-2/Qwen style) trained deterministically on a fixed
    word list, so every text is encodable and decodes losslessly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=1, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [" ".join(WORDS)] * 3 + [" " + w for w in WORDS] + [" ".join(str(i) for i in range(100))]
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<|im_end|>", bos_token=None,
                                   additional_special_tokens=["<|endoftext|>", "<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    if out_dir:
        fast.save_pretrained(out_dir)
        _portable_tokenizer_config(out_dir)
    return fast


def _portable_tokenizer_config(out_dir: str) -> None:
    """Make the saved tokenizer loadable by transformers 4.x and 5.x alike:
    transformers 5 writes tokenizer_class "TokenizersBackend" and a list-valued
    extra_special_tokens, which 4.x cannot read."""
    p = os.path.join(out_dir, "tokenizer_config.json")
    with open(p) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    elif isinstance(extra, dict):
        cfg["extra_special_tokens"] = extra
    cfg.pop("backend", None)
    if not os.path.exists(os.path.join(out_dir, "chat_template.jinja")):
        cfg["chat_template"] = CHAT_TEMPLATE
    with open(p, "w") as f:
        json.dump(cfg, f, indent=2)


def make_tiny_model(out_dir: str, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, intermediate: int | None = None, max_positions: int = 512,
                    wide: bool = False, tie_word_embeddings: bool = False) -> str:
    """Write a tiny random Qwen2ForCausalLM + tokenizer into ``out_dir``; return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if wide:
        hidden, intermediate, heads, kv_heads = 256, 1024, 8, 4
    os.makedirs(out_dir, exist_ok=True)
    tok = make_tokenizer(out_dir)
    vocab_size = len(tok)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # larger init than default so outputs depend visibly on the weights
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def make_tiny_moe_model(out_dir: str, seed: int = 0, hidden: int = 32, layers: int = 2, experts: int = 4,
                        moe_intermediate: int = 24, top_k: int = 2) -> str:
    """Write a tiny random Qwen3MoeForCausalLM (every layer sparse) + tokenizer into ``out_dir``; return it.

    The default sizes keep every expert matrix non-square (hidden 32, moe_intermediate 24, so the fused
    ``w13`` is 48 x 32 and ``w2`` 32 x 24): a layout mix-up shows as a shape error, never as silently
    transposed arithmetic."""
    import torch
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    os.makedirs(out_dir, exist_ok=True)
    tok = make_tokenizer(out_dir)
    cfg = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=moe_intermediate, num_experts=experts, num_experts_per_tok=top_k,
                         decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=None, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


if __name__ == "__main__":
    import sys
    print(make_tiny_model(sys.argv[1], wide="--wide" in sys.argv))


def make_tiny_mla_model(out_dir: str, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 2,
                        kv_lora_rank: int = 16, qk_nope_head_dim: int = 8, qk_rope_head_dim: int = 4,
                        v_head_dim: int = 8, max_positions: int = 512) -> str:
    """Write a tiny random DeepseekV2ForCausalLM (MLA: ``kv_b_proj`` = [W_UK; W_UV] per head) +
    tokenizer into ``out_dir``; every MLP dense (``first_k_dense_replace = layers``), attention
    projections with biases."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, GenerationConfig

    os.makedirs(out_dir, exist_ok=True)
    tok = make_tokenizer(out_dir)
    cfg = DeepseekV2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                           moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=heads, q_lora_rank=None, kv_lora_rank=kv_lora_rank,
                           qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim,
                           v_head_dim=v_head_dim, first_k_dense_replace=layers, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, attention_bias=True,
                           max_position_embeddings=max_positions, tie_word_embeddings=False,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                           torch_dtype="float32")
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


if __name__ == "__main__":
    import sys
    print(make_tiny_model(sys.argv[1], wide="--wide" in sys.argv))
