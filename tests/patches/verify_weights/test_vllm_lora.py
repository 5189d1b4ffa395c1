"""Weight verification with vLLM's own LoRA: the adapter in vLLM's LoRA manager compared with what ms-swift pushed.

Real ms-swift releases on the vLLM stand-in (``tests/scenarios/swift_run.py``): 4.6.0 ``--tuner_type lora
--vllm_enable_lora true`` (``--lora-merge --vllm-lora``: PEFT rank 4 on ``q_proj``/``v_proj``, bf16; the base
pushed once under ``.base_layer`` names, then ``_move_adapter_to_vllm`` -> ``add_lora`` of a
``TensorLoRARequest`` through ms-swift's ``patch_vllm_load_adapter``), and 3.10.1 / 3.11.1 ``--train_type lora
--vllm_enable_lora true`` (``--lora``: ms-swift's own ``prepare_model``, every linear layer, float32). Faults are
injected at the engine's ``add_lora`` (``--adapter-fault``); ``adapter_off`` is the observation (the trainer's
LoRA modules whose delta the engine's registered adapter does not give, in float64).

Before: every such rollout counted ``unverifiable`` ("vLLM's own LoRA ... not compared yet"), a dropped or stale
adapter tensor went unreported.
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.support.swift_support import run_swift

DROP = "model.layers.1.self_attn.q_proj"
STALE = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
SLOT = "model.layers.0.self_attn.v_proj"


@functools.lru_cache(maxsize=None)
def swift(version: str, *extra: str, **env) -> dict:
    base = ("--lora",) if version.startswith("3.") else ("--lora-merge", "--vllm-lora")
    return run_swift(version, *base, "--steps", "3", "--shim", *extra, env={"SHIM_VERIFY_WEIGHTS": "1", **env})


def stale(r: dict) -> list:
    return [w for w in r["shim_warnings"] if "stale weights" in w]


def off_steps(r: dict) -> list:
    return sorted({g["step"] for g in r["generates"] if g["adapter_off"]})


def test_adapter_push_verified():
    """Every rollout verified, none unverifiable; the base (``.base_layer`` names, every linear layer vLLM wraps)
    and the adapter both compared; the engine's adapter really is the trainer's (the observation)."""
    r = swift("4.6.0", "--level", "1")
    assert r["decisions"]["verify-weights-swift-4x"] == "applied"
    assert len(r["generates"]) == 6 and off_steps(r) == [], r["generates"]
    assert r["verify"]["verified"] == 6 and r["verify"]["stale"] == r["verify"]["unverifiable"] == 0, r["verify"]
    assert not [w for w in r["shim_warnings"] if "verify-weights" in w], r["shim_warnings"]


def test_adapter_module_dropped_is_stale_where_it_matters():
    """Every adapter push leaves one module's ``lora_A``/``lora_B`` out. ``lora_B`` starts at zero (PEFT's
    initialisation): at step 0 the module adds nothing and the engine computes as the trainer (verified); from
    step 1 on it is stale, the WARNING names that module's tensors -- exactly the steps the observation finds."""
    r = swift("4.6.0", "--level", "1", "--zero-b", "--adapter-fault", f"drop:{DROP}")
    assert off_steps(r) == [1, 2], r["generates"]  # the fault is real from step 1 (the observation)
    assert r["verify"]["stale"] == 4 and r["verify"]["verified"] == 2 and r["verify"]["unverifiable"] == 0, r["verify"]
    warnings = stale(r)
    assert len(warnings) == 4 and all("at step 0" not in w for w in warnings), warnings
    assert all(f"first differing: {DROP}.lora_a (LoRA adapter " in w and "not in the engine's adapter" in w
               for w in warnings), warnings[0]


def test_adapter_tensor_stale_is_reported():
    """Every adapter push carries one ``lora_B`` as at the first push: stale from the step the trainer moved it,
    naming that tensor only (``v_proj.lora_b``: the scaling folded in, as vLLM stores it)."""
    r = swift("4.6.0", "--level", "1", "--adapter-fault", f"stale:{STALE}")
    assert off_steps(r) == [1, 2], r["generates"]
    assert r["verify"]["stale"] == 4 and r["verify"]["verified"] == 2, r["verify"]
    assert all("first differing: model.layers.1.self_attn.v_proj.lora_b (LoRA adapter " in w and "lora_a" not in w
               for w in stale(r)), stale(r)


def test_adapter_slot_zeroed_is_reported():
    """The adapter registered and active, but one module's device slot (what the forward reads) zeroed: stale,
    naming that slot, although the manager's own copy of the adapter is right (the observation sees no fault)."""
    r = swift("4.6.0", "--level", "1", "--adapter-fault", f"slot:{SLOT}")
    assert off_steps(r) == [], r["generates"]
    assert r["verify"]["stale"] == 6, r["verify"]
    assert all(f"first differing: {SLOT}.lora_a@slot0 (LoRA adapter " in w for w in stale(r)), stale(r)


def test_adapter_strict_stops_the_run():
    """``SHIM_STRICT=1``: the first stale rollout (step 1) raises ``StaleWeights`` out of ms-swift's rollout."""
    proc = run_swift("4.6.0", "--lora-merge", "--vllm-lora", "--steps", "3", "--shim", "--level", "1", "--zero-b",
                     "--adapter-fault", f"drop:{DROP}", env={"SHIM_VERIFY_WEIGHTS": "1", "SHIM_STRICT": "1"},
                     check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "StaleWeights: [shim] verify-weights LLMEngine#1" in proc.stderr, proc.stderr[-3000:]
    assert "stale weights at step 1" in proc.stderr and f"{DROP}.lora_a" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("version,disabled,steps", [("3.10.1", "swift-level2-resync", [0, 1, 2]),
                                                    ("3.11.1", "swift-level2-lora-adapter", [1, 2])])
def test_level2_lora_gap_reported_and_fixed_run_verified(version, disabled, steps):
    """ms-swift's own LoRA model with vLLM's LoRA at level 2: with the level-2 fix switched off the engine samples
    from other weights (3.10.1: garbage base and adapter slots; 3.11.1: no adapter after the sleep), reported at
    exactly the generates the observation finds wrong; with the fix every rollout is verified."""
    off = swift(version, "--level", "2", SHIM_DISABLED_PATCHES=disabled)
    wrong = [g for g in off["generates"] if g["mismatch"]]
    assert wrong and sorted({g["step"] for g in wrong}) == steps, off["generates"]
    assert off["verify"]["stale"] == len(wrong) and off["verify"]["unverifiable"] == 0, off["verify"]
    if version == "3.11.1":
        assert all("(no LoRA adapter in vLLM's LoRA manager)" in w for w in stale(off)), stale(off)
    on = swift(version, "--level", "2")
    assert on["mismatches"] == 0 and on["verify"]["verified"] == len(on["generates"]) == 6, on["verify"]


def test_fused_base_layer_maps_to_the_trainer_s_base_layer_names():
    """vLLM's LoRA keeps each linear layer as ``base_layer`` (``qkv_proj.base_layer.weight``): its slices are the
    trainer's q/k/v under ``.base_layer`` names (a PEFT-targeted layer's own, or the alias
    ``shim.peft.adapter`` gives an untargeted one), per tensor-parallel rank as without LoRA."""
    from shim.verify import layout
    from tests.patches.verify_weights.test_verify import QKVParallelLinear, trainer_state

    full = trainer_state(2)
    attn = torch.nn.Module()
    attn.qkv_proj = torch.nn.Module()  # the LoRA layer (vllm/lora/layers: MergedQKVParallelLinearWithLoRA)
    attn.qkv_proj.base_layer = QKVParallelLinear(full, "model.layers.0.self_attn", 2, rank=1, tp=2)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.model.layers[0].self_attn = attn
    desc = layout.describe(model)["params"]["model.layers.0.self_attn.qkv_proj.base_layer.weight"]
    names = [piece[0] for piece in desc["layout"]["pieces"]]
    assert names == [f"model.layers.0.self_attn.{p}_proj.base_layer.weight" for p in "qkv"], desc
    plain = layout.describe(model)["params"]["model.layers.0.self_attn.qkv_proj.base_layer.bias"]["layout"]
    assert [p[1:] for p in plain["pieces"]] == [p[1:] for p in layout.param_layout(
        "model.layers.0.self_attn.qkv_proj.bias", attn.qkv_proj.base_layer.bias, attn.qkv_proj.base_layer,
        layout.DEFAULT_PACKED)["pieces"]]  # the same slices as the layer without LoRA


def _manager(loras: dict, packed: "dict | None" = None):
    from types import SimpleNamespace

    adapter = SimpleNamespace(id=5, rank=4, loras=loras)
    manager = SimpleNamespace(list_adapters=lambda: {5: adapter}, packed_modules_mapping=packed or {},
                              lora_index_to_id=[None], modules={})
    return SimpleNamespace(lora_manager=manager)


def test_scaling_folded_or_kept_apart_and_packed_modules():
    """The layouts vLLM keeps an adapter in, without an engine: ``lora_b`` with the scaling folded in
    (``optimize()``, the stand-in's 0.10.2) or kept apart (``weights.scaling``), a packed module (``qkv_proj``:
    a list per kind, ``None`` where the adapter has no such module) under the names of the modules it packs;
    a changed element or another scaling is named."""
    from types import SimpleNamespace

    from shim.verify import lora

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 16, generator=g), torch.randn(12, 4, generator=g)
    pushed = {"m.q_proj": (a, b, 2.0)}

    def check(model, want=pushed):
        return lora.compare([{"rank": 0, "lora": lora.engine_digests(model, {"id": None})}], want)

    folded = SimpleNamespace(lora_a=a.t().clone(), lora_b=b.t() * 2.0, scaling=1)
    apart = SimpleNamespace(lora_a=a.t().clone(), lora_b=b.t().clone(), scaling=2.0)
    assert check(_manager({"m.q_proj": folded})) == check(_manager({"m.q_proj": apart})) == []
    assert check(_manager({"m.q_proj": apart}), {"m.q_proj": (a, b, 4.0)}) == [
        "m.q_proj.lora_a (LoRA adapter 5: scaling 2.0, pushed 4.0)",
        "m.q_proj.lora_b (LoRA adapter 5: scaling 2.0, pushed 4.0)"]
    packed = SimpleNamespace(lora_a=[a.t().clone(), None, a.t().clone()], lora_b=[b.t() * 2.0, None, b.t() * 2.0],
                             scaling=[1, 1, 1])
    model = _manager({"m.qkv_proj": packed}, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    both = {"m.q_proj": (a, b, 2.0), "m.v_proj": (a, b, 2.0)}
    assert check(model, both) == []
    packed.lora_b[2][3, 1] += 1.0
    assert check(model, both) == ["m.v_proj.lora_b (LoRA adapter 5)"]
