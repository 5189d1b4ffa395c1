"""A second model (a distillation teacher) loaded under its own ZeRO-3 config, and a
memory preflight computed from its ``config.json`` alone.

transformers decides how ``from_pretrained`` places a model from ONE process-global DeepSpeed config
(``transformers.integrations.deepspeed._hf_deepspeed_config_weak_ref``, set by the student's
``TrainingArguments``). With a ZeRO-2 student that config says "not ZeRO-3", so a teacher whose own DeepSpeed
config is ZeRO-3 is still loaded whole onto every rank and partitioned only later by ``deepspeed.initialize``.
:func:`zero3_load_context` loads it partitioned; :func:`preflight` compares the bytes each rank will hold with
the device's free memory without opening a weight file. Test seam: :data:`device_memory` and
:data:`world_size` are module-level callables, looked up at call time; a CPU test replaces them (e.g. 8 ranks
of 80 GB) before the teacher is loaded.
"""
from __future__ import annotations

import contextlib
import json
import os

GB = 1e9

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4, "float64": 8, "double": 8,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1, "uint8": 1,
}


class TeacherWontFit(RuntimeError):
    """The teacher cannot fit on a rank under the placement it would be loaded with."""


# --- parameter count ---------------------------------------------------------------------


def _get(cfg: dict, *names, default=None):
    for n in names:
        v = cfg.get(n)
        if v is not None:
            return v
    return default


def _text_config(cfg: dict) -> dict:
    """The language-model part of a (possibly multimodal, possibly nested) config."""
    for key in ("thinker_config", "text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and sub:
            merged = dict(cfg)
            merged.pop(key)
            merged.update(_text_config(sub))
            return merged
    return cfg


def _vision_params(cfg: dict) -> int:
    vc = cfg.get("vision_config")
    if isinstance(cfg.get("thinker_config"), dict):
        vc = cfg["thinker_config"].get("vision_config", vc)
    if not isinstance(vc, dict):
        return 0
    h = int(_get(vc, "hidden_size", "embed_dim", default=0) or 0)
    depth = int(_get(vc, "depth", "num_hidden_layers", default=0) or 0)
    if not h or not depth:
        return 0
    i = int(_get(vc, "intermediate_size", default=4 * h))
    blocks = depth * (4 * h * h + 2 * h * i + 4 * h)
    merge = int(_get(vc, "spatial_merge_size", default=1))
    out = int(_get(vc, "out_hidden_size", default=h))
    hm = h * merge * merge
    mergers = 1 + len(vc.get("deepstack_visual_indexes") or [])
    patch = 3 * int(_get(vc, "temporal_patch_size", default=1)) * int(_get(vc, "patch_size", default=14)) ** 2 * h
    return blocks + mergers * (hm * hm + hm * out) + patch


def count_parameters(config: dict) -> int:
    """Approximate parameter count of a causal LM from its config dict (formula above).

    Per decoder layer, with H = hidden_size, I = intermediate_size, V = vocab_size, d = head_dim
    (default H / num_attention_heads), nq / nkv = attention / key-value heads::

        attention = H*nq*d + 2*H*nkv*d + nq*d*H      (+ q/k/v biases when the config has them)
        dense MLP = 3*H*I                            (gated: gate, up, down)
        MoE MLP   = E*3*H*Im + H*E                   (E experts of moe_intermediate_size Im, router)
                  + 3*H*Is + H                       (shared expert of size Is, with its gate, if any)
        norms     = 2*H
        total     = layers + V*H (embeddings) + V*H (lm_head, unless tied) + H (final norm)
                  + vision tower (``vision_config``: depth*(4*h*h + 2*h*i) + patch merger, approximate)

    A layer is MoE when the config has experts and ``(i + 1) % decoder_sparse_step == 0``, ``i`` is
    not in ``mlp_only_layers`` and ``i >= first_k_dense_replace``. Nested ``text_config`` (Qwen3-VL,
    Qwen3-VL-MoE, Qwen2.5-VL) and ``thinker_config`` are followed. The estimate ignores small terms
    (rotary buffers, q/k norms, conv stems); for Qwen3-235B-A22B it gives 235.1e9 (published: 235e9).
    """
    cfg = _text_config(config)
    H = int(cfg["hidden_size"])
    L = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    V = int(cfg["vocab_size"])
    nq = int(_get(cfg, "num_attention_heads", "n_head"))
    nkv = int(_get(cfg, "num_key_value_heads", default=nq))
    d = int(_get(cfg, "head_dim", default=H // nq))
    I = int(_get(cfg, "intermediate_size", default=4 * H))
    attn = H * nq * d + 2 * H * nkv * d + nq * d * H
    if cfg.get("attention_bias") or cfg.get("model_type") in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"):
        attn += nq * d + 2 * nkv * d
    E = int(_get(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0) or 0)
    Im = int(_get(cfg, "moe_intermediate_size", default=I))
    Is = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
    n_shared = int(_get(cfg, "n_shared_experts", default=0) or 0)
    if n_shared and not Is:
        Is = n_shared * Im
    step = int(_get(cfg, "decoder_sparse_step", default=1) or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    first_dense = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
    moe_mlp = E * 3 * H * Im + H * E + (3 * H * Is + (H if Is and not n_shared else 0) if Is else 0)
    total = 0
    for i in range(L):
        is_moe = E > 0 and (i + 1) % step == 0 and i not in dense_only and i >= first_dense
        total += attn + 2 * H + (moe_mlp if is_moe else 3 * H * I)
    tied = bool(_get(cfg, "tie_word_embeddings", default=config.get("tie_word_embeddings", False)))
    total += V * H * (1 if tied else 2) + H
    return total + _vision_params(config)


def config_dtype(config: dict) -> str | None:
    cfg = _text_config(config)
    for c in (config, cfg):
        v = _get(c, "torch_dtype", "dtype")
        if isinstance(v, str):
            return v
    return None


def dtype_bytes(dtype) -> int:
    """Bytes per element of a torch dtype, or of its name ('bfloat16', 'torch.float16', ...)."""
    name = str(dtype).replace("torch.", "").lower() if dtype is not None else "bfloat16"
    return _DTYPE_BYTES.get(name, 2)


def read_config(model_dir: str) -> dict | None:
    """The model's config.json as a dict (None where there is none). Reads no weight."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- placement, memory, preflight ---------------------------------------------------------


def _device_memory() -> tuple | None:
    """(free, total) bytes of this rank's accelerator, or None on a CPU-only host."""
    from shim.vllm import memory

    p = memory.probe()
    return p.mem_get_info() if p is not None else None


def _world_size() -> int:
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


device_memory = _device_memory
"""Test seam: () -> (free, total) bytes of this rank's device, or None (no check)."""
world_size = _world_size
"""Test seam: () -> number of ranks a ZeRO-3 load partitions over."""


def zero3_offloads_params(ds_config: dict | None) -> bool:
    zo = (ds_config or {}).get("zero_optimization") or {}
    device = (zo.get("offload_param") or {}).get("device", "none")
    return str(device).lower() in ("cpu", "nvme")


def zero_stage(ds_config) -> int | None:
    if not isinstance(ds_config, dict):
        return None
    stage = (ds_config.get("zero_optimization") or {}).get("stage")
    return int(stage) if isinstance(stage, int) or (isinstance(stage, str) and stage.isdigit()) else None


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.05 * GB or n == 0 else f"{n / 1e6:.1f} MB"


def _count(n: int) -> str:
    return f"~{n / 1e9:.1f}e9" if n >= 1e8 else f"~{n / 1e6:.2f}e6"


class Estimate:
    """What the preflight computed (also logged when it passes)."""

    __slots__ = ("params", "dtype", "bytes_per_param", "total_bytes", "partitioned", "ranks",
                 "per_rank_bytes", "free_bytes", "device_total_bytes")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.per_rank_bytes <= self.free_bytes

    def text(self) -> str:
        where = (f"partitioned over {self.ranks} ranks (ZeRO-3 load)" if self.partitioned
                 else "whole on every rank")
        mem = ("no device memory probe" if self.free_bytes is None
               else f"{_gb(self.free_bytes)} free of {_gb(self.device_total_bytes)}")
        return (f"{_count(self.params)} parameters x {self.bytes_per_param} bytes ({self.dtype}) = "
                f"{_gb(self.total_bytes)}, {where}: {_gb(self.per_rank_bytes)} per rank; {mem}")


def estimate(config: dict, *, dtype=None, partitioned: bool, offload_params: bool = False) -> Estimate:
    """Bytes per rank for a model loaded with ``config`` under the given placement."""
    params = count_parameters(config)
    dtype = dtype if dtype is not None else (config_dtype(config) or "bfloat16")
    nbytes = dtype_bytes(dtype)
    total = params * nbytes
    ranks = world_size() if partitioned else 1
    per_rank = 0 if (partitioned and offload_params) else -(-total // max(ranks, 1))
    mem = device_memory()
    return Estimate(params=params, dtype=str(dtype).replace("torch.", ""), bytes_per_param=nbytes,
                    total_bytes=total, partitioned=partitioned, ranks=ranks, per_rank_bytes=per_rank,
                    free_bytes=None if mem is None else int(mem[0]),
                    device_total_bytes=None if mem is None else int(mem[1]))


def wont_fit_message(est: Estimate, *, model: str, student_stage, teacher_stage, server_option: bool,
                     patch_id: str = "swift-gkd-teacher-zero3") -> str:
    """ONE error text: the numbers, why, and the fixes that apply to this placement."""
    need_ranks = -(-est.total_bytes // max(est.free_bytes, 1))
    fixes = []
    if not est.partitioned:
        if teacher_stage != 3:
            fixes.append("--teacher_deepspeed zero3 (with the shim the teacher then loads partitioned: "
                         f"{est.total_bytes / max(world_size(), 1) / GB:.1f} GB per rank over {world_size()} ranks)")
        fixes.append("--deepspeed zero3 or --deepspeed zero3_offload for the student (then the teacher loads "
                     "partitioned under the student's config too)")
    else:
        fixes.append("--teacher_deepspeed zero3_offload (teacher parameters kept in CPU memory)")
        fixes.append(f"at least {need_ranks} ranks")
    if server_option:
        fixes.append("--teacher_model_server URL (serve the teacher outside the training ranks)")
    else:
        fixes.append("ms-swift 4.x: --teacher_model_server URL (serve the teacher outside the training ranks)")
    student = f"zero{student_stage}" if student_stage is not None else "no deepspeed"
    teacher = f"zero{teacher_stage}" if teacher_stage is not None else "none"
    return (f"[shim] GKD teacher {model} cannot fit: {est.text()} "
            f"(student --deepspeed {student}, --teacher_deepspeed {teacher}). "
            f"Loading it would run out of device memory part-way. Fixes: {'; or '.join(fixes)}. "
            "Computed from config.json only; no weight was read. "
            f"To skip this check: SHIM_DISABLED_PATCHES={patch_id}.")


# --- temporary ZeRO-3 config for one load ---------------------------------------------------


@contextlib.contextmanager
def zero3_load_context(teacher_ds_config: dict, training_args):
    """Load under a temporary ZeRO-3 HF DeepSpeed config; restore the global after.

    The global weak reference is saved before and put back afterwards, whatever
    happens inside (as ms-swift's ``disable_deepspeed_zero3`` does). The teacher's
    dict is copied: ms-swift hands the same dict to ``prepare_deepspeed`` later.

    The mirror image of ms-swift's ``disable_deepspeed_zero3()``: for the duration of the teacher's
    load it points the global at a temporary ``HfTrainerDeepSpeedConfig`` built from the teacher's
    config ("auto" values resolved from the student's ``TrainingArguments`` with
    ``trainer_config_process``, exactly as ms-swift's ``prepare_deepspeed`` resolves them later), so
    ``from_pretrained`` runs under ``deepspeed.zero.Init`` and every parameter is partitioned as it is
    created; then it restores the student's weak reference.
    """
    import copy

    import transformers.integrations.deepspeed as hf_ds

    saved = hf_ds._hf_deepspeed_config_weak_ref
    try:
        temporary = hf_ds.HfTrainerDeepSpeedConfig(copy.deepcopy(teacher_ds_config))  # sets the global
        hf_ds.set_hf_deepspeed_config(temporary)
        if training_args is not None:
            temporary.trainer_config_process(training_args)
        yield temporary
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved
