"""Which slices of which trainer tensors each engine parameter holds (one worker's view), and the trainer's names.

Each worker describes its own parameters (:func:`describe`), from vLLM's own layer attributes and the model's
``packed_modules_mapping``, so each tensor-parallel rank compares its own shard with the matching slice of the
trainer's full tensor.

Per tensor, never per engine: a parameter whose layout is not understood, or whose values are quantized (an
integer pack, or float8 with a scale: :func:`quantized`), is left out with its reason (``skip`` in
:func:`describe`) and its bytes count as not verified (:func:`share`); every other parameter is compared as
before.
"""
from __future__ import annotations

DEFAULT_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
TRAINER_WRAPPERS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
FLOATING = ("float16", "bfloat16", "float32", "float64",
            "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
"""Engine dtypes compared (bit patterns of floating weights; integer/quantized ones are not mapped)."""
EXPERT_NAMES = ("gate_proj", "down_proj", "up_proj")
"""Checkpoint names of one expert's gate / down / up projections where the fused experts module does not name
them (``ckpt_*_proj_name``, vLLM 0.33+): Qwen2/3-MoE, DeepSeek, OLMoE (Mixtral's ``w1``/``w2``/``w3`` before
0.33 then map to no trainer tensor: those engine tensors are unverifiable, said with the reason)."""


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
    None: not a layout this knows (the tensor is left out). Fused experts: :func:`experts_layout`."""
    shape = list(param.shape)
    if not shape:
        return {"dim": 0, "pieces": [[name, 0, 1, 0]], "scalar": True}
    leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    tp_size = int(getattr(module, "tp_size", 1) or 1)
    tp_rank = int(getattr(module, "tp_rank", 0) or 0)
    out_dim = getattr(param, "output_dim", None)
    in_dim = getattr(param, "input_dim", None)
    if name.endswith(("w13_weight", "w2_weight")) and hasattr(module, "w13_weight") and hasattr(module, "w2_weight"):
        return experts_layout(name, module)
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


def experts_layout(name: str, module) -> "dict | None":
    """The layout of a fused experts parameter: ``w13_weight`` [E, 2I, H] holds, in expert slot ``e``, the
    gate rows then the up rows of expert ``e``'s checkpoint tensors, ``w2_weight`` [E, H, I] its down columns
    (each a tensor-parallel rank's ``I`` rows / columns of the full ``I * tp_size``). Pieces carry a fifth
    field, the slot (index into dim 0); ``dim`` is within the slot. Mirrors vLLM 0.34
    ``layers/fused_moe/routed_experts.py`` (``build_expert_params_mapping`` :1192, :1252-1321: ``experts.<e>.<gate|up>``
    -> ``w13_``, ``<down>`` -> ``w2_``; ``_load_w13`` :570-619: ``w1`` rows ``[0, I)``, ``w3`` rows ``[I, 2I)``,
    the checkpoint's rows ``I * tp_rank``; ``_load_w2`` :621-670: columns ``I * tp_rank``; ``expert_map`` :298:
    global -> local slot, -1 elsewhere; checkpoint names ``ckpt_*_proj_name`` :119-121) and
    ``runner/moe_runner.py`` :309-312 (the parameters under ``experts.routed_experts.``); before 0.33 the same
    loaders on ``FusedMoE`` (``tp_rank``/``tp_size`` on the layer, parameters under ``experts.``). None: not
    that layout (e.g. vllm-ascend's transposed [E, H, 2I] after loading, a non-gated w13)."""
    w13, w2 = module.w13_weight, module.w2_weight
    if getattr(w13, "dim", lambda: 0)() != 3 or getattr(w2, "dim", lambda: 0)() != 3:
        return None
    slots, rows, hidden = w13.shape
    inter = w2.shape[2]
    if rows != 2 * inter or w2.shape[1] != hidden or w2.shape[0] != slots:
        return None
    config = getattr(module, "moe_config", None)
    tp_rank = int(getattr(config, "tp_rank", getattr(module, "tp_rank", 0)) or 0)
    gate, down, up = (getattr(module, f"ckpt_{kind}_proj_name", None) or default
                      for kind, default in zip(("gate", "down", "up"), EXPERT_NAMES))
    base = name.rsplit(".", 1)[0]
    base = base[:-len(".routed_experts")] if base.endswith(".routed_experts") else base
    where = getattr(module, "expert_map", None)  # global expert -> local slot (-1: another rank's)
    expert = list(range(slots))
    if where is not None:
        local = [int(x) for x in where.tolist()]
        expert = [local.index(slot) if slot in local else None for slot in range(slots)]
        if None in expert:
            return None
    pieces = []
    for slot, e in enumerate(expert):
        if name.endswith("w13_weight"):
            pieces += [[f"{base}.{e}.{gate}.weight", 0, inter, tp_rank * inter, slot],
                       [f"{base}.{e}.{up}.weight", inter, inter, tp_rank * inter, slot]]
        else:
            pieces.append([f"{base}.{e}.{down}.weight", 0, inter, tp_rank * inter, slot])
    return {"dim": 0 if name.endswith("w13_weight") else 1, "pieces": pieces}


SCALES = ("_scale", "_scale_inv", "_scale_2", "scales", "_zero_point", "qzeros", "g_idx")
"""Leaf endings of quantization metadata: vLLM's fp8 ``weight_scale`` / ``weight_scale_inv`` / ``input_scale``
(``layers/quantization/fp8.py`` :330, :343), ``w13_weight_scale``, GPTQ/AWQ ``scales`` / ``qzeros`` / ``g_idx``."""


def quantized(name: str, param, module) -> "str | None":
    """Why engine parameter ``name`` holds quantized values the trainer's tensors are not compared with exactly
    (None: compared). An integer dtype is a pack (GPTQ/AWQ ``qweight``, fp4 ``weight_packed``); float8 next to a
    scale (``<leaf>_scale``, ``weight_scale_inv``) holds the weight divided by that scale, rounded by vLLM's
    quantization kernel, which the shim does not reproduce bit for bit; the scales themselves have no trainer
    tensor. float8 without a scale is the trainer's values rounded to float8: compared exactly."""
    leaf = name.rsplit(".", 1)[-1]
    dtype = str(param.dtype).replace("torch.", "")
    if leaf.endswith(SCALES) and any(str(p.dtype).replace("torch.", "") not in FLOATING[:4]
                                     for p in module.parameters(recurse=False)):  # next to a quantized weight
        return "quantization metadata, no trainer tensor"
    if dtype not in FLOATING:
        return f"{dtype}: a packed quantized weight"
    if dtype.startswith("float8"):
        scale = next((n for n, _ in module.named_parameters(recurse=False) if n.startswith(leaf) and
                      n.endswith(SCALES)), None) or next((n for n in ("weight_scale", "weight_scale_inv")
                                                          if leaf == "weight" and hasattr(module, n)), None)
        if scale is not None:
            return f"{dtype} scaled by {scale}: quantized by vLLM's kernel, not reproduced exactly"
    return None


def share(descs: dict, names, stale=()) -> "tuple[int, int]":
    """``(verified, total)`` bytes of the engine's parameters over every worker: those named in ``names``
    count as verified unless ``(rank, name)`` is in ``stale``."""
    names, stale = set(names), set(stale)
    verified = total = 0
    for rank, desc in descs.items():
        for name, d in desc["params"].items():
            total += d.get("bytes", 0)
            if name in names and (rank, name) not in stale:
                verified += d.get("bytes", 0)
    return verified, total


def tp_rank(model) -> int:
    for module in model.modules():
        if hasattr(module, "tp_rank"):
            return int(module.tp_rank or 0)
    return 0


def describe(model) -> dict:
    """Every parameter of the engine's model: shape, dtype and layout (one worker's view).

    For every parameter, which trainer tensor(s) and which slice of them it holds, from vLLM's own layer
    attributes (``tp_rank``/``tp_size``, ``output_sizes`` of ``MergedColumnParallelLinear``, the head
    counts and ``num_kv_head_replicas`` of ``QKVParallelLinear``, ``shard_indices`` of
    ``VocabParallelEmbedding``, the ``output_dim``/``input_dim`` weight attributes) and the
    model's ``packed_modules_mapping`` (``qkv_proj`` = ``q_proj,k_proj,v_proj``,
    ``gate_up_proj`` = ``gate_proj,up_proj``), and fused MoE experts (``w13_weight`` / ``w2_weight``:
    one slot per expert, :func:`experts_layout`).
    """
    packed = dict(DEFAULT_PACKED)
    packed.update({k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()})
    owner = {}
    for _, module in model.named_modules():
        for _, param in module.named_parameters(recurse=False):
            owner.setdefault(id(param), module)
    params = {}
    for name, param in model.named_parameters():  # tied parameters once, under their first name
        plain = name.replace(".base_layer.", ".")  # vLLM's LoRA layer keeps the linear layer as base_layer
        lay = param_layout(plain, param, owner[id(param)], packed)
        if lay is not None and plain != name:  # the trainer's tensors under .base_layer names too
            lay["pieces"] = [[_base_layer(piece[0]), *piece[1:]] for piece in lay["pieces"]]
        params[name] = {"shape": list(param.shape), "dtype": str(param.dtype).replace("torch.", ""),
                        "bytes": param.numel() * param.element_size(), "layout": lay}
        why = quantized(name, param, owner[id(param)])
        if why:
            params[name]["skip"] = why
        leaf = plain.rsplit(".", 2)[-2] if "." in plain else ""
        if params[name]["layout"] is None and leaf in packed:  # the trainer tensors it packs, layout unknown
            params[name]["holds"] = [_leaf_replace(plain, leaf, part) for part in packed[leaf]]
    return {"rank": tp_rank(model), "params": params}


def _base_layer(name: str) -> str:
    """``a.q_proj.weight`` -> ``a.q_proj.base_layer.weight`` (a PEFT or vLLM LoRA layer's base tensor)."""
    head, _, leaf = name.rpartition(".")
    return f"{head}.base_layer.{leaf}"


def engine_views(param, layout: dict) -> list:
    """The engine parameter's rows each layout piece covers (views, no copy)."""
    if layout.get("scalar"):
        return [param.reshape(1)]
    dim = layout["dim"]
    return [(param[piece[4]] if len(piece) > 4 else param).narrow(dim, piece[1], piece[2]) for piece in layout["pieces"]]


def trainer_view(tensor, layout: dict, piece: list):
    """The trainer tensor's slice one layout piece maps (``[name, engine_start, length, trainer_start]``)."""
    if layout.get("scalar"):
        return tensor.reshape(1)
    length, t_start = piece[2], piece[3]
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
        if d.get("skip"):
            bad.append(f"{name} ({d['skip']})")
        elif layout is None:
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
