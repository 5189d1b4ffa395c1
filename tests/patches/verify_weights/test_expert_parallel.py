"""Fused experts under expert parallelism, and a worker's answer without digests.

vLLM 0.34 ``layers/fused_moe/routed_experts.py`` ``expert_map`` (:298): a rank holds some of the global experts,
``expert_map[global] = local slot`` (-1: another rank's); the loader writes global expert ``e``'s checkpoint
tensors into slot ``expert_map[e]``. The check must compare each slot with the trainer's tensors of the global
expert that slot holds (before: slot ``s`` with trainer expert ``s``, every rollout of an EP engine stale).
"""
from __future__ import annotations

import torch

from tests.patches.verify_weights import test_verify as base
from tests.patches.verify_weights.test_tensor_map import (
    EXPERTS,
    E,
    FakeLLM,
    Trainer,
    counts,
    delta,
    engine,
    moe_state,
    trainer_model,
)
from tests.patches.verify_weights.test_verify import _param

verify, warnings = base.verify, base.warnings  # test_verify's fixtures


class ExpertParallelExperts(torch.nn.Module):
    """One EP rank's fused experts (TP 1): the global experts ``held`` in its slots, ``expert_map`` as vLLM
    builds it (a tensor over every global expert: its local slot, -1 for another rank's)."""

    def __init__(self, full: dict, held: list):
        super().__init__()
        self.moe_config = type("MoEConfig", (), {"tp_rank": 0, "tp_size": 1})()
        self.ckpt_gate_proj_name, self.ckpt_down_proj_name, self.ckpt_up_proj_name = "gate_proj", "down_proj", "up_proj"
        self.expert_map = torch.tensor([held.index(e) if e in held else -1 for e in range(E)])
        self.w13_weight = _param(torch.stack([torch.cat([full[f"{EXPERTS}{e}.gate_proj.weight"],
                                                         full[f"{EXPERTS}{e}.up_proj.weight"]]) for e in held]))
        self.w2_weight = _param(torch.stack([full[f"{EXPERTS}{e}.down_proj.weight"] for e in held]))


def test_expert_parallel_rank_compares_each_slot_with_the_global_expert_it_holds(verify, warnings):
    full = moe_state()
    model, eng = trainer_model(full), engine(full, experts=True)
    eng.model.layers[0].mlp.experts = ExpertParallelExperts(full, held=[2, 3])  # EP rank 1 of 2
    llm = FakeLLM(eng)
    before = counts(verify)
    Trainer().rollout(verify, llm, model)
    assert delta(verify, before) == {"verified": 1, "partly_verified": 0, "stale": 0, "unverifiable": 0}, warnings
    with torch.no_grad():  # slot 1 holds global expert 3: its down projection not what the push gave
        eng.model.layers[0].mlp.experts.w2_weight[1, 0, 0].add_(0.5)
    before = counts(verify)
    Trainer().rollout(verify, llm, model)
    assert delta(verify, before)["stale"] == 1, warnings
    assert f"{EXPERTS}w2_weight (experts.3.down_proj.weight)" in warnings[-1], warnings


def test_a_worker_answer_without_digests_is_never_equal():
    """A worker whose answer carries no digests (or fewer than asked) compared nothing: every tensor asked for
    differs, never "equal" (``zip`` over an empty answer would find no difference)."""
    from shim.verify import compare, layout

    full = moe_state()
    eng, model = engine(full), trainer_model(full)
    desc = layout.describe(eng)
    params = layout.trainer_params(model)
    names, _ = layout.mapped(desc, params)
    got = compare.fingerprint(eng, {"describe": False, "names": names})
    assert compare.compare([got], {0: desc}, names, params) == []  # the real answer: equal
    assert compare.compare([{"rank": 0}], {0: desc}, names, params) == names
    assert compare.compare([{"rank": 0, "digests": got["digests"][:1]}], {0: desc}, names, params) == names
