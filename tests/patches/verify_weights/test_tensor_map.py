"""Per-tensor mapping of the engine's weights: fused MoE experts, fused qkv written in part, quantized tensors.

Engines built here from vLLM's layer attributes, like ``test_verify.py``'s: the fused experts of vLLM 0.34
``layers/fused_moe/routed_experts.py`` (``w13_weight`` [E, 2I, H]: each expert's gate rows then its up rows,
``w2_weight`` [E, H, I]: its down projection; a tensor-parallel rank holds ``I`` of the ``I * tp_size`` rows /
columns, ``_load_w13`` :570-619, ``_load_w2`` :621-670), and an fp8 linear as ``Fp8LinearMethod.create_weights``
makes it (``layers/quantization/fp8.py`` :330: a float8_e4m3fn ``weight`` next to a float32 ``weight_scale``).
The TRL / ms-swift check (``shim.verify.weights``) runs through the in-process driver worker; verl's
(``shim.verl.verify_weights``) through its ``update_weights`` wrapper with an adapter whose ``_execute_method``
asks the engine directly, and a loader mirroring vLLM's ``load_weights`` with its ``stacked_params_mapping``
(``qkv_proj`` <- q/k/v, ``gate_up_proj`` <- gate/up) and expert mapping (``experts.<e>.<gate|up|down>_proj``).
Each test asserts the half that failed before per-tensor mapping.
"""
from __future__ import annotations

import asyncio
import json

import pytest
import torch

from tests.patches.verify_weights import test_verify as base
from tests.patches.verify_weights.test_verify import (
    HEAD,
    NH,
    FakeLLM,
    MergedColumnParallelLinear,
    Norm,
    QKVParallelLinear,
    RowParallelLinear,
    Trainer,
    VocabParallelEmbedding,
    _param,
    trainer_state,
)

verify, warnings = base.verify, base.warnings  # test_verify's fixtures

E, I, H = 4, 6, 16  # experts, intermediate size, hidden size (test_verify's H)
P = "model.layers.0."
EXPERTS = P + "mlp.experts."


def moe_state(seed: int = 0) -> dict:
    full = trainer_state(2, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for e in range(E):
        for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            full[f"{EXPERTS}{e}.{proj}.weight"] = torch.randn(*shape, generator=g)
    return full


class FusedExperts(torch.nn.Module):
    """The attributes of vLLM's fused experts layer that the loaders use: ``w13_weight`` / ``w2_weight``,
    ``moe_config.tp_rank`` (0.34; ``tp_rank`` on ``FusedMoE`` before), ``ckpt_*_proj_name``."""

    def __init__(self, full: dict, rank: int, tp: int):
        super().__init__()
        self.moe_config = type("MoEConfig", (), {"tp_rank": rank, "tp_size": tp})()
        self.ckpt_gate_proj_name, self.ckpt_down_proj_name, self.ckpt_up_proj_name = "gate_proj", "down_proj", "up_proj"
        part = I // tp
        rows = lambda t: t[rank * part:(rank + 1) * part]  # noqa: E731
        self.w13_weight = _param(torch.stack([torch.cat([rows(full[f"{EXPERTS}{e}.gate_proj.weight"]),
                                                         rows(full[f"{EXPERTS}{e}.up_proj.weight"])])
                                              for e in range(E)]))
        self.w2_weight = _param(torch.stack([full[f"{EXPERTS}{e}.down_proj.weight"][:, rank * part:(rank + 1) * part]
                                             for e in range(E)]))


class Fp8Linear(torch.nn.Module):
    """An online-fp8 linear (vLLM ``fp8.py`` :330): float8_e4m3fn ``weight`` = the weight over a per-tensor
    ``weight_scale``, rounded; ``weight_scale`` float32."""

    def __init__(self, full: torch.Tensor):
        super().__init__()
        scale = full.abs().max() / 448.0
        self.weight = _param((full / scale).to(torch.float8_e4m3fn), output_dim=0, input_dim=1)
        self.weight_scale = _param(scale.reshape(1).float())


def engine(full: dict, rank: int = 0, tp: int = 1, experts: bool = False, fp8: bool = False):
    """A one-layer vLLM model: fused qkv / gate_up, row-parallel o / down, vocab-parallel embedding."""
    model, inner, layer, attn, mlp = (torch.nn.Module() for _ in range(5))
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    attn.qkv_proj = QKVParallelLinear(full, P + "self_attn", 2, rank, tp)
    attn.o_proj = Fp8Linear(full[P + "self_attn.o_proj.weight"]) if fp8 else \
        RowParallelLinear(full[P + "self_attn.o_proj.weight"], rank, tp)
    mlp.gate_up_proj = MergedColumnParallelLinear(full, P + "mlp", rank, tp)
    mlp.down_proj = RowParallelLinear(full[P + "mlp.down_proj.weight"], rank, tp)
    if experts:
        mlp.experts = FusedExperts(full, rank, tp)
    layer.self_attn, layer.mlp, layer.input_layernorm = attn, mlp, Norm(full[P + "input_layernorm.weight"])
    inner.embed_tokens = VocabParallelEmbedding(full["model.embed_tokens.weight"], rank, tp)
    inner.layers = torch.nn.ModuleList([layer])
    model.model = inner
    return model


def trainer_model(full: dict) -> torch.nn.Module:
    model = torch.nn.Module()
    for k, v in full.items():
        *path, leaf = k.split(".")
        mod = model
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(v.clone()))
    return model


def counts(verify) -> dict:
    c = verify.counts()
    return {k: c.get(k, 0) for k in ("verified", "partly_verified", "stale", "unverifiable")}


def delta(verify, before: dict) -> dict:
    return {k: v - before[k] for k, v in counts(verify).items()}


# ---------------------------------------------------------------------------
# TRL / ms-swift: the check before each generate
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("rank,tp", [(0, 1), (1, 2)], ids=["tp1", "tp2-rank1"])
def test_moe_engine_one_expert_slice_wrong_is_stale_naming_it(verify, warnings, rank, tp):
    """The fused experts are compared slot by slot with the trainer's per-expert tensors (before: no trainer
    tensor ``...experts.w13_weight``, the experts never compared and the rollout called verified)."""
    full = moe_state()
    model, eng = trainer_model(full), engine(full, rank, tp, experts=True)
    llm = FakeLLM(eng)
    before = counts(verify)
    Trainer().rollout(verify, llm, model)
    assert delta(verify, before) == {"verified": 1, "partly_verified": 0, "stale": 0, "unverifiable": 0}, warnings
    assert {EXPERTS + "w13_weight", EXPERTS + "w2_weight"} <= set(verify.target_for(llm).mapped)
    with torch.no_grad():  # expert 2's up rows (this rank's) not what the push gave
        eng.model.layers[0].mlp.experts.w13_weight[2, I // tp:].add_(0.5)
    before = counts(verify)
    Trainer().rollout(verify, llm, model)
    assert delta(verify, before)["stale"] == 1, warnings
    tag = f" (tp rank {rank})" if rank else ""
    (warning,) = [w for w in warnings if "stale weights" in w]
    assert f"first differing: {EXPERTS}w13_weight{tag} (experts.2.up_proj.weight))" in warning, warning
    with torch.no_grad():  # expert 3's down columns: w2 (this rank's columns of the trainer's down_proj)
        eng.model.layers[0].mlp.experts.w13_weight[2, I // tp:].sub_(0.5)
        eng.model.layers[0].mlp.experts.w2_weight[3, 0, 0].add_(0.5)
    Trainer().rollout(verify, llm, model)
    assert f"{EXPERTS}w2_weight{tag} (experts.3.down_proj.weight)" in warnings[-1], warnings


def test_quantized_tensor_is_skipped_by_name_share_below_100_never_verified(verify, warnings, monkeypatch,
                                                                           tmp_path, capsys):
    """An fp8 ``o_proj.weight`` (with its ``weight_scale``) is left out, by name and reason, said once; every
    other tensor is compared; the rollout is ``partly_verified`` with the verified share of the engine's bytes
    in the trainer's metrics, the trace and ``python -m shim report``; never ``verified``. Before, the fp8 bits
    were compared with the trainer's values rounded to fp8 without the scale: every rollout stale."""
    from shim.cli.report import report
    from shim.observe import trainer_metrics

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SHIM_TRACE", str(trace))
    full = trainer_state(2)
    model, eng = trainer_model(full), engine(full, fp8=True)
    llm = FakeLLM(eng)
    before = counts(verify)
    for _ in range(2):
        Trainer().rollout(verify, llm, model)
    assert delta(verify, before) == {"verified": 0, "partly_verified": 2, "stale": 0, "unverifiable": 0}, warnings
    (said,) = warnings  # once
    assert f"{P}self_attn.o_proj.weight (float8_e4m3fn scaled by weight_scale" in said, said
    assert f"{P}self_attn.o_proj.weight_scale (quantization metadata" in said and "partly_verified" in said, said
    params = {n: p for n, p in eng.named_parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    left = sum(params[P + f"self_attn.o_proj.{n}"].numel() * params[P + f"self_attn.o_proj.{n}"].element_size()
               for n in ("weight", "weight_scale"))
    share = round((total - left) / total, 4)
    assert 0 < share < 1
    figures = trainer_metrics.figures()
    assert figures["shim/verified_share"] == share and figures["shim/rollouts_partly_verified"] >= 2, figures
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["verdict"] for r in records] == ["partly verified"] * 2 and records[-1]["share"] == share, records
    assert report([str(trace)]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    names = [c.strip() for c in header.split("  ") if c.strip()]
    starts = [header.index(n) for n in names] + [None]
    cells = {n: row[a:b].strip() for n, a, b in zip(names, starts, starts[1:])}
    assert cells.get("verified") == "0" and cells.get("partly verified") == "2", out
    assert cells.get("min verified share") == f"{100 * share:.1f}%", out
    assert f"not verified: {P}self_attn.o_proj.weight (float8_e4m3fn scaled by weight_scale" in out, out

    with torch.no_grad():  # the rest is still compared: a stale down_proj is found next to the fp8 tensor
        eng.model.layers[0].mlp.down_proj.weight.add_(0.25)
    before = counts(verify)
    Trainer().rollout(verify, llm, model)
    assert delta(verify, before)["stale"] == 1 and f"first differing: {P}mlp.down_proj.weight" in warnings[-1]
    assert trainer_metrics.figures()["shim/verified_share"] < share


# ---------------------------------------------------------------------------
# verl: the check after ServerAdapter.update_weights
# ---------------------------------------------------------------------------
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def load_weights(model, weights, drop=()) -> None:
    """vLLM's ``load_weights`` at TP 1: ``stacked_params_mapping`` (q/k/v -> ``qkv_proj`` rows, gate/up ->
    ``gate_up_proj`` rows), the expert mapping (``experts.<e>.gate_proj`` -> ``w13_weight[e, :I]``, ``up_proj``
    -> ``[e, I:]``, ``down_proj`` -> ``w2_weight[e]``), else the parameter of that name (KeyError: unknown)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in weights:
            if name in drop:
                continue
            parts = name.split(".")
            if "experts" in parts and parts[-2] in ("gate_proj", "up_proj", "down_proj"):
                e = int(parts[-3])
                base = ".".join(parts[:-3])
                if parts[-2] == "down_proj":
                    params[f"{base}.w2_weight"][e].copy_(t)
                else:
                    params[f"{base}.w13_weight"][e].narrow(0, 0 if parts[-2] == "gate_proj" else I, I).copy_(t)
            elif parts[-2] in STACKED:
                fused, k = STACKED[parts[-2]]
                param = params[".".join(parts[:-2] + [fused, parts[-1]])]
                start = sum(full_rows(model, parts, j) for j in range(k))
                param.narrow(0, start, t.shape[0]).copy_(t)
            elif name.endswith("embed_tokens.weight"):
                params[name][:t.shape[0]].copy_(t)
            elif params[name].dtype == torch.float8_e4m3fn:  # online fp8: quantized at load
                scale = params[name[:-len("weight")] + "weight_scale"]
                scale.copy_(t.abs().max().reshape(1) / 448.0)
                params[name].copy_((t / scale).to(torch.float8_e4m3fn))
            else:
                params[name].copy_(t)


def full_rows(model, parts, j) -> int:
    module = model.get_submodule(".".join(parts[:-2] + [STACKED[parts[-2]][0]]))
    if len(module.output_sizes) == 3:
        return [NH * HEAD, module.num_kv_heads * HEAD, module.num_kv_heads * HEAD][j]
    return module.output_sizes[j]


class Adapter:
    """verl's ``ServerAdapter`` as the wrapper reads it (0.9.0+: ``_has_server``); ``_execute_method`` reaches
    the worker's ``shim_weight_digests`` directly."""

    _has_server = True
    replica_rank = 0

    def __init__(self, model):
        self.model = model
        self.drop, self.missing = (), ()

    async def _execute_method(self, method, args=()):
        from shim.verify import compare

        return [compare.fingerprint(self.model, args[0])]

    async def update_weights(self, weights, global_steps=None, **kwargs):
        load_weights(self.model, [(n, t) for n, t in weights if n not in self.missing], self.drop)


def update(adapter, full: dict, skip=()) -> None:
    from shim.verl import verify_weights

    stream = ((n, t) for n, t in full.items() if n not in skip)
    asyncio.run(verify_weights.update_weights_wrapper(adapter.update_weights, adapter, (stream,), {"global_steps": 1}))


def stepped(full: dict, by: float = 0.01) -> dict:
    return {k: v + by for k, v in full.items()}


def test_verl_fused_qkv_with_v_not_streamed_is_reported(verify, warnings):
    """An update that streams q and k but not v writes two thirds of ``qkv_proj``: reported naming the tensor
    and what was not streamed (before: the pieces not streamed were skipped and the update called verified)."""
    full = moe_state()
    adapter = Adapter(engine(full, experts=True))
    before = counts(verify)
    update(adapter, stepped(full))
    assert delta(verify, before) == {"verified": 1, "partly_verified": 0, "stale": 0, "unverifiable": 0}, warnings
    before = counts(verify)
    update(adapter, stepped(full, 0.02), skip={P + "self_attn.v_proj.weight"})
    assert delta(verify, before)["stale"] == 1, warnings
    assert (f"first differing: {P}self_attn.qkv_proj.weight ({P}self_attn.v_proj.weight not streamed)"
            in warnings[-1]), warnings
    before = counts(verify)  # one expert's up_proj not streamed: its w13 slot is half old
    update(adapter, stepped(full, 0.03), skip={EXPERTS + "1.up_proj.weight"})
    assert delta(verify, before)["stale"] == 1 and f"{EXPERTS}w13_weight ({EXPERTS}1.up_proj.weight not streamed)" \
        in warnings[-1], warnings
    before = counts(verify)  # and one dropped inside the engine's loader: the slot differs, named
    adapter.drop = {EXPERTS + "3.down_proj.weight"}
    update(adapter, stepped(full, 0.04))
    assert delta(verify, before)["stale"] == 1 and f"{EXPERTS}w2_weight (experts.3.down_proj.weight)" \
        in warnings[-1], warnings


def test_verl_unmapped_tensor_leaves_the_missing_tensor_rule_on_for_the_rest(verify, warnings):
    """An engine with one tensor left out (fp8 ``o_proj``) and one of unknown layout: the streamed tensors they
    hold are not called missing, but a streamed tensor the engine holds nowhere still is (before: one unmapped
    engine tensor switched that rule off for the whole engine), as is a tensor the loader dropped; a clean update
    is ``partly_verified``, never ``verified``."""
    full = trainer_state(2)
    model = engine(full, fp8=True)
    odd = torch.nn.Module()  # a module whose parameter the layout cannot explain (a packed name, no output_sizes)
    odd.weight = _param(torch.zeros(3, 3), output_dim=0)
    model.model.layers[0].mlp.add_module("gate_up_proj", odd)
    adapter = Adapter(model)
    adapter.missing = {P + "mlp.gate_proj.weight", P + "mlp.up_proj.weight", "model.layers.0.mlp.down_proj.bias"}
    before = counts(verify)
    update(adapter, stepped(full))
    assert delta(verify, before) == {"verified": 0, "partly_verified": 1, "stale": 0, "unverifiable": 0}, warnings
    (said,) = warnings
    assert f"{P}self_attn.o_proj.weight (float8_e4m3fn" in said and f"{P}mlp.gate_up_proj.weight (layout" in said
    extra = {**stepped(full, 0.02), "model.layers.0.mlp.down_proj.bias": torch.zeros(H)}  # the engine has none
    before = counts(verify)
    update(adapter, extra)
    assert delta(verify, before)["stale"] == 1, warnings
    assert "model.layers.0.mlp.down_proj.bias (streamed, not in the engine)" in warnings[-1], warnings
    assert "o_proj" not in warnings[-1] and "gate_proj" not in warnings[-1], warnings
    adapter.drop = {P + "input_layernorm.weight"}
    update(adapter, stepped(full, 0.03))
    assert f"first differing: {P}input_layernorm.weight" in warnings[-1], warnings
