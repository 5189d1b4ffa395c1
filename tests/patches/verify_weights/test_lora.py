"""Weight verification of PEFT LoRA runs (real TRL releases + PEFT, bf16 trainer, the vLLM stand-in).

A push of a PEFT model gives the engine the adapter merged into the base (``merge_adapter``, each base
tensor, ``unmerge_adapter``; with the shim's ``trl-lora-merge-drift*`` fix, merged out of place). The
check compares the engine with exactly that: the trainer side is PEFT's own ``merge`` of each LoRA layer
applied to copies of its base tensors (``shim.peft.merge.verified_tensors``, the function the fix pushes
with), under the names the push gives them (``base_model.model.`` and ``.base_layer`` dropped, the adapter
tensors left out). Before this, every LoRA rollout counted ``shim/rollouts_unverifiable`` ("PEFT model").
"""
from __future__ import annotations

import functools
import tempfile

import pytest

from tests.support.trl_support import run_trl

WRONG = "model.layers.1.self_attn.q_proj.weight"
"""A LoRA-targeted tensor the injected push leaves out (the engine keeps the checkpoint's base, no adapter)."""


@functools.lru_cache(maxsize=None)
def lora(version: str, trainer: str = "grpo", *extra: str, **env) -> dict:
    out = tempfile.mkdtemp(prefix=f"verify-lora-{version}-{trainer}-")
    return run_trl(version, out, "--trainer", trainer, "--shim", "before", "--lora", "--steps", "4", *extra,
                   env={"SHIM_VERIFY_WEIGHTS": "1", **env})


@pytest.mark.parametrize("version,trainer", [("1.16.0", "grpo"), ("1.9.2", "grpo"), ("0.27.2", "grpo"),
                                             ("0.27.2", "rloo")])
def test_lora_rollouts_verified(version, trainer):
    """Every rollout verified, none unverifiable (before: 8 of 8 unverifiable, 'PEFT model'); every engine
    tensor compared; the engine really holds base + adapter (the LoRA test's own float32 reference)."""
    r = lora(version, trainer)
    assert r["decisions"]["verify-weights-trl" if version >= "0.28" else f"verify-weights-trl-{trainer}"] == "applied"
    assert len(r["generates"]) == 8
    assert r["verify"]["unverifiable"] == 0, (r["verify"], r["shim_warnings"])
    assert r["verify"]["verified"] == 8 and r["verify"]["stale"] == 0, (r["verify"], r["shim_warnings"])
    assert not [w for w in r["shim_warnings"] if "verify-weights" in w], r["shim_warnings"]
    info = next(m for _, m in r["shim_log"] if "comparing" in m)
    assert "comparing 27 of 27 engine tensors" in info, info  # the LoRA-merged ones too
    assert all(g["beyond"] == 0 for g in r["generates"])  # engine = base + adapter (the observation)


def test_lora_push_missing_one_tensor_reported():
    """Every push leaves out one LoRA-merged tensor: each rollout is stale, the WARNING names that tensor."""
    r = lora("1.16.0", "grpo", "--skip-push", WRONG)
    assert max(g["beyond"] for g in r["generates"]) > 0  # the engine lacks the adapter there (the observation)
    assert r["verify"]["stale"] == 8 and r["verify"]["verified"] == r["verify"]["unverifiable"] == 0, r["verify"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert len(stale) == 5 and all(f"first differing: {WRONG});" in w for w in stale), stale
    assert all("Only tensors with a LoRA adapter merged into them differ" in w for w in stale), stale[0]


def test_lora_strict_stops_the_run():
    r = lora("1.16.0", "grpo", "--skip-push", WRONG, SHIM_STRICT="1")
    assert r["error"] and r["error"].startswith("StaleWeights: [shim] verify-weights LLMEngine#1"), r["error"]
    assert WRONG in r["error"] and r["verify"]["stale"] == 1


def test_lora_drift_fix_off_is_stale():
    """``trl-lora-merge-drift`` disabled: upstream's unmerge moves the frozen base after each push, so the
    trainer's base + adapter is no longer what the engine got: reported (the LoRA layers' tensors only)."""
    r = lora("1.16.0", "grpo", SHIM_DISABLED_PATCHES="trl-lora-merge-drift")
    assert r["generates"][0]["base_changed"] > 0  # the drift shows (the observation)
    assert r["verify"]["stale"] == 8 and r["verify"]["unverifiable"] == 0, r["verify"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert stale and "q_proj.weight" in stale[0] and "k_proj" not in stale[0], stale[0]
    assert all("LoRA adapter merged into them differ" in w and "merge/unmerge" in w for w in stale), stale[0]


def test_online_dpo_lora_verified_and_its_drift_reported():
    """OnlineDPO (1.16.0) pushes a PEFT model through its own ``_move_model_to_vllm``, which no
    ``trl-lora-merge-drift*`` record covers: upstream's unmerge moves the frozen base after every push. The check
    compares every tensor (none unverifiable; before: every rollout unverifiable) and reports that drift at every
    rollout, on the LoRA-merged tensors only, with the LoRA note."""
    r = lora("1.16.0", "online_dpo")
    assert r["decisions"]["verify-weights-trl-online-dpo"] == "applied"
    assert min(g["base_changed"] for g in r["generates"]) > 0  # the drift (the observation)
    assert r["verify"]["unverifiable"] == 0 and r["verify"]["stale"] == len(r["generates"]) == 8, r["verify"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert stale and all("OnlineDPOTrainer._generate_vllm_colocate" in w and "LoRA adapter merged" in w
                         for w in stale), stale[0]


def test_plain_tensor_missing_gets_no_lora_note():
    """A push that leaves out a tensor without an adapter: stale, without the LoRA note."""
    r = lora("1.16.0", "grpo", "--skip-push", "model.layers.1.self_attn.k_proj.weight")
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert r["verify"]["stale"] == 8 and stale and "k_proj.weight" in stale[0], r["verify"]
    assert not [w for w in stale if "LoRA" in w], stale[0]


# ---------------------------------------------------------------------------
# ms-swift: the full push with the adapter merged (vLLM's LoRA off), level 2
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def swift(version: str, *extra: str) -> dict:
    from tests.support.swift_support import run_swift

    return run_swift(version, "--lora-merge", "--steps", "3", "--shim", *extra, env={"SHIM_VERIFY_WEIGHTS": "1"})


@pytest.mark.parametrize("version,record", [("4.6.0", "verify-weights-swift-4x"), ("3.10.1", "verify-weights-swift")])
def test_swift_lora_full_push_verified(version, record):
    """Every rollout verified (before: every one unverifiable, 'PEFT model')."""
    r = swift(version)
    assert r["decisions"][record] == "applied"
    assert len(r["generates"]) == 6 and all(g["beyond"] == 0 for g in r["generates"])
    assert r["verify"]["unverifiable"] == 0, (r["verify"], r["shim_warnings"])
    assert r["verify"]["verified"] == 6 and r["verify"]["stale"] == 0, r["verify"]
    assert not [w for w in r["shim_warnings"] if "verify-weights" in w], r["shim_warnings"]


def test_swift_lora_push_missing_one_tensor_reported():
    r = swift("4.6.0", "--skip-push", WRONG)
    assert max(g["beyond"] for g in r["generates"]) > 0  # the observation: that tensor lacks the adapter
    assert r["verify"]["stale"] == 6 and r["verify"]["verified"] == r["verify"]["unverifiable"] == 0, r["verify"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert len(stale) == 5 and all(f"first differing: {WRONG});" in w for w in stale), stale


# ---------------------------------------------------------------------------
# the trainer side alone (PEFT on a small torch model)
# ---------------------------------------------------------------------------
def _peft(**config):
    import torch
    from peft import LoraConfig, get_peft_model

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.o_proj = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()

        def forward(self, x):
            return self.model.o_proj(self.model.q_proj(x))

    torch.manual_seed(0)
    return get_peft_model(Net().to(torch.bfloat16), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                                init_lora_weights=False, **config))


def test_merged_tensors_are_the_push_s_bit_for_bit():
    """Names as the push gives them, the adapter tensors left out; a LoRA base weight derived = PEFT's in-place
    merge of the whole model (what upstream pushes), bit for bit; the base keeps its bytes."""
    import torch

    from shim.peft import merge

    model = _peft()
    tensors, why = merge.verified_tensors(model)
    assert why is None and sorted(tensors) == ["model.o_proj.bias", "model.o_proj.weight", "model.q_proj.bias",
                                                "model.q_proj.weight"], sorted(tensors)
    assert sorted(tensors.derived) == ["model.q_proj.weight"]
    base = model.base_model.model.model.q_proj.base_layer.weight
    before = base.detach().clone()
    derived = tensors.derive("model.q_proj.weight")
    assert torch.equal(base, before) and not torch.equal(derived, before)
    model.merge_adapter()
    try:
        assert torch.equal(derived.view(torch.int16), base.detach().view(torch.int16))
    finally:
        model.unmerge_adapter()


def test_lora_variant_unverifiable_with_its_reason():
    from shim.peft import merge

    tensors, why = merge.verified_tensors(_peft(use_dora=True))
    assert tensors is None and "LoRA variants" in why, why
    assert merge.verified_tensors(torch_module()) == (None, None)  # not PEFT: the model's own parameters


def torch_module():
    import torch

    return torch.nn.Linear(2, 2)
