"""Which slices of which trainer tensors each engine parameter holds (one worker's view), and the trainer's names.

Each worker describes its own parameters (:func:`describe`): for every parameter, which
trainer tensor(s) and which slice of them it holds, from vLLM's own layer attributes
(``tp_rank``/``tp_size``, ``output_sizes`` of ``MergedColumnParallelLinear``, the head
counts and ``num_kv_head_replicas`` of ``QKVParallelLinear``, ``shard_indices`` of
``VocabParallelEmbedding``, the ``output_dim``/``input_dim`` weight attributes) and the
model's ``packed_modules_mapping`` (``qkv_proj`` = ``q_proj,k_proj,v_proj``,
``gate_up_proj`` = ``gate_proj,up_proj``). So each tensor-parallel rank compares its own
shard with the matching slice of the trainer's full tensor.
"""
from __future__ import annotations

DEFAULT_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
TRAINER_WRAPPERS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
FLOATING = ("float16", "bfloat16", "float32", "float64",
            "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
"""Engine dtypes compared (bit patterns of floating weights; integer/quantized ones are not mapped)."""


def _leaf_replace(name: str, leaf: str, new: str) -> str:
    head, _, tail = name.rpartition(f"{leaf}.")
    return f"{head}{new}.{tail}"


def param_layout(name: str, param, module, packed: dict) -> "dict | None":
    """Which trainer tensor slices engine parameter ``name`` (held by ``module``) is made of.

    ``{"dim": d, "pieces": [[trainer_name, engine_start, length, trainer_start], ...]}``:
    along dimension ``d`` the engine's rows ``[engine_start, engine_start + length)`` are
    the trainer tensor's rows ``[trainer_start, trainer_start + length)``; every other
    dimension is equal. Mirrors the weight loaders of vLLM 0.24
    ``vllm/model_executor/layers/linear.py`` (``QKVParallelLinear.weight_loader``: q rows
    at ``tp_rank``, k/v at ``tp_rank // num_kv_head_replicas``; ``MergedColumnParallelLinear``:
    each of ``output_sizes`` split by ``tp_size``; ``ColumnParallelLinear`` along
    ``output_dim``, ``RowParallelLinear`` along ``input_dim``) and
    ``vocab_parallel_embedding.py`` (rows ``org_vocab_start_index..end``; padding unmapped).
    None: not a layout this knows (the tensor is left out)."""
    shape = list(param.shape)
    if not shape:
        return {"dim": 0, "pieces": [[name, 0, 1, 0]], "scalar": True}
    leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    tp_size = int(getattr(module, "tp_size", 1) or 1)
    tp_rank = int(getattr(module, "tp_rank", 0) or 0)
    out_dim = getattr(param, "output_dim", None)
    in_dim = getattr(param, "input_dim", None)
    parts = packed.get(leaf)
    if parts and getattr(module, "output_sizes", None) is not None and out_dim is not None:
        if len(parts) != len(module.output_sizes):
            return None
        if hasattr(module, "num_kv_head_replicas") and len(parts) == 3:  # QKVParallelLinear
            hs, vhs = module.head_size, getattr(module, "v_head_size", module.head_size)
            nh, nkv, rep = module.num_heads, module.num_kv_heads, module.num_kv_head_replicas
            kv_rank = tp_rank // rep
            sizes = [(nh * hs, tp_rank), (nkv * hs, kv_rank), (nkv * vhs, kv_rank)]
        else:  # MergedColumnParallelLinear
            sizes = [(size // tp_size, tp_rank) for size in module.output_sizes]
        pieces, start = [], 0
        for part, (size, rank) in zip(parts, sizes):
            pieces.append([_leaf_replace(name, leaf, part), start, size, rank * size])
            start += size
        if start != shape[out_dim]:
            return None
        return {"dim": out_dim, "pieces": pieces}
    if parts:  # a packed name this layer shape does not explain
        return None
    indices = getattr(module, "shard_indices", None)
    if indices is not None and out_dim is not None:  # VocabParallelEmbedding / ParallelLMHead
        start, end = indices.org_vocab_start_index, indices.org_vocab_end_index
        return {"dim": out_dim, "pieces": [[name, 0, end - start, start]]}
    if tp_size > 1 and out_dim is not None and hasattr(module, "output_size_per_partition") \
            and not hasattr(module, "input_is_parallel"):  # ColumnParallelLinear (weight and bias)
        n = shape[out_dim]
        return {"dim": out_dim, "pieces": [[name, 0, n, tp_rank * n]]}
    if tp_size > 1 and in_dim is not None and hasattr(module, "input_is_parallel"):  # RowParallelLinear
        n = shape[in_dim]
        return {"dim": in_dim, "pieces": [[name, 0, n, tp_rank * n]]}
    return {"dim": 0, "pieces": [[name, 0, shape[0], 0]]}  # replicated (norms, RowParallel bias, TP 1)


def tp_rank(model) -> int:
    for module in model.modules():
        if hasattr(module, "tp_rank"):
            return int(module.tp_rank or 0)
    return 0


def describe(model) -> dict:
    """Every parameter of the engine's model: shape, dtype and layout (one worker's view)."""
    packed = dict(DEFAULT_PACKED)
    packed.update({k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()})
    owner = {}
    for _, module in model.named_modules():
        for _, param in module.named_parameters(recurse=False):
            owner.setdefault(id(param), module)
    params = {}
    for name, param in model.named_parameters():  # tied parameters once, under their first name
        params[name] = {"shape": list(param.shape), "dtype": str(param.dtype).replace("torch.", ""),
                        "layout": param_layout(name, param, owner[id(param)], packed)}
    return {"rank": tp_rank(model), "params": params}


def engine_views(param, layout: dict) -> list:
    """The engine parameter's rows each layout piece covers (views, no copy)."""
    if layout.get("scalar"):
        return [param.reshape(1)]
    return [param.narrow(layout["dim"], e_start, length) for _, e_start, length, _ in layout["pieces"]]


def trainer_view(tensor, layout: dict, piece: list):
    """The trainer tensor's slice one layout piece maps (``[name, engine_start, length, trainer_start]``)."""
    if layout.get("scalar"):
        return tensor.reshape(1)
    _, _, length, t_start = piece
    return tensor.narrow(layout["dim"], t_start, length)


# ---------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------
def trainer_name(name: str) -> str:
    """A trainer parameter's name as the push gives it to vLLM (TRL ``_fix_param_name_to_vllm``)."""
    for wrapper in TRAINER_WRAPPERS:
        name = name.replace(wrapper, "")
    return name[len("module."):] if name.startswith("module.") else name


def trainer_params(model) -> dict:
    params = {}
    for name, p in model.named_parameters():
        params.setdefault(trainer_name(name), p)
    if "lm_head.weight" not in params and "model.embed_tokens.weight" in params:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]  # tied embeddings
    return params


def unverifiable_reason(model) -> "str | None":
    """Why a trainer model cannot be compared with its engine (None: it can)."""
    if getattr(model, "peft_config", None) is not None or hasattr(model, "merge_adapter"):
        return "PEFT model (the engine holds the merged adapters)"
    for name, p in model.named_parameters():
        if "_flat_param" in name or type(p).__name__ == "FlatParameter":
            return "FSDP1 flat parameters"
        break
    return None


def mapped(desc: dict, params: dict) -> "tuple[list, list]":
    """``(mapped, unmapped)`` engine parameter names of one worker: mapped ones have a known
    layout, a floating dtype and every trainer tensor they are made of; unmapped ones are
    ``"name (why)"``."""
    good, bad = [], []
    for name, d in desc["params"].items():
        layout = d["layout"]
        if layout is None:
            bad.append(f"{name} (layout not understood)")
        elif d["dtype"] not in FLOATING:
            bad.append(f"{name} ({d['dtype']})")
        else:
            missing = [p[0] for p in layout["pieces"] if p[0] not in params]
            if missing:
                bad.append(f"{name} (no trainer tensor {missing[0]})")
            else:
                good.append(name)
    return good, bad
