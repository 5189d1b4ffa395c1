"""Weight verification (SHIM_VERIFY_WEIGHTS): the engine's weights against the trainer's before each generate.

- On the real TRL 1.9.2 GRPOTrainer (stand-in engine): with the #5312 fix switched off
  (``SHIM_DISABLED_PATCHES=trl-stale-weights``) verification reports ``stale weights`` at
  exactly the generates where the test's own bit-for-bit observation sees the engine differ
  from the trainer; with the fix on it stays silent; TRL 1.10.0 (no fix applies) is verified
  too; SHIM_STRICT stops the run.
- Tensor parallelism on CPU tensors: rank r of 2 of vLLM's fused ``qkv_proj`` / ``gate_up_proj``,
  row- and column-parallel and vocab-parallel layers, built here the way vLLM 0.24's weight
  loaders (``vllm/model_executor/layers/linear.py``, ``vocab_parallel_embedding.py``) slice
  the full tensors; each rank's shard compared with its slice of the trainer's tensor.
"""
from __future__ import annotations

import functools
import logging
import tempfile

import pytest
import torch

from tests.support.trl_support import run_trl


@pytest.fixture
def verify(monkeypatch):
    from shim.engine import config
    from shim.verify import weights as v

    monkeypatch.setenv(config.SHIM_VERIFY_WEIGHTS, "1")
    monkeypatch.delenv(config.SHIM_STRICT, raising=False)
    return v


# ---------------------------------------------------------------------------
# tensor parallelism: vLLM's layer attributes (vllm 0.24 linear.py / vocab_parallel_embedding.py)
# ---------------------------------------------------------------------------
H, HEAD, NH, FF, V = 16, 4, 4, 24, 40


def trainer_state(n_kv: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    p = "model.layers.0."
    return {"model.embed_tokens.weight": r(V, H),
            p + "self_attn.q_proj.weight": r(NH * HEAD, H), p + "self_attn.q_proj.bias": r(NH * HEAD),
            p + "self_attn.k_proj.weight": r(n_kv * HEAD, H), p + "self_attn.k_proj.bias": r(n_kv * HEAD),
            p + "self_attn.v_proj.weight": r(n_kv * HEAD, H), p + "self_attn.v_proj.bias": r(n_kv * HEAD),
            p + "self_attn.o_proj.weight": r(H, NH * HEAD),
            p + "mlp.gate_proj.weight": r(FF, H), p + "mlp.up_proj.weight": r(FF, H),
            p + "mlp.down_proj.weight": r(H, FF), p + "input_layernorm.weight": r(H)}


def _param(t, **attrs):
    p = torch.nn.Parameter(t.clone(), requires_grad=False)
    for k, v in attrs.items():  # vLLM's set_weight_attrs
        setattr(p, k, v)
    return p


class QKVParallelLinear(torch.nn.Module):
    """Attributes of vLLM's QKVParallelLinear; shard = q rows at tp_rank, k/v at tp_rank // replicas."""

    def __init__(self, full: dict, prefix: str, n_kv: int, rank: int, tp: int = 2):
        super().__init__()
        self.tp_rank, self.tp_size, self.head_size, self.v_head_size = rank, tp, HEAD, HEAD
        self.total_num_heads, self.total_num_kv_heads = NH, n_kv
        self.num_heads = NH // tp
        if tp >= n_kv:
            self.num_kv_heads, self.num_kv_head_replicas = 1, tp // n_kv
        else:
            self.num_kv_heads, self.num_kv_head_replicas = n_kv // tp, 1
        self.output_sizes = [self.num_heads * HEAD * tp, self.num_kv_heads * HEAD * tp, self.num_kv_heads * HEAD * tp]
        self.output_size_per_partition = sum(self.output_sizes) // tp
        kv_rank = rank // self.num_kv_head_replicas
        for kind in ("weight", "bias"):
            q = full[f"{prefix}.q_proj.{kind}"].chunk(tp)[rank]
            k = full[f"{prefix}.k_proj.{kind}"].chunk(n_kv // self.num_kv_heads)[kv_rank]
            v = full[f"{prefix}.v_proj.{kind}"].chunk(n_kv // self.num_kv_heads)[kv_rank]
            attrs = {"output_dim": 0, "input_dim": 1} if kind == "weight" else {"output_dim": 0}
            setattr(self, kind, _param(torch.cat([q, k, v]), **attrs))


class MergedColumnParallelLinear(torch.nn.Module):
    def __init__(self, full: dict, prefix: str, rank: int, tp: int = 2):
        super().__init__()
        self.tp_rank, self.tp_size, self.output_sizes = rank, tp, [FF, FF]
        self.output_size_per_partition = 2 * FF // tp
        gate, up = (full[f"{prefix}.{n}_proj.weight"].chunk(tp)[rank] for n in ("gate", "up"))
        self.weight = _param(torch.cat([gate, up]), output_dim=0, input_dim=1)


class RowParallelLinear(torch.nn.Module):
    def __init__(self, full: torch.Tensor, rank: int, tp: int = 2):
        super().__init__()
        self.tp_rank, self.tp_size, self.input_is_parallel = rank, tp, True
        self.input_size_per_partition, self.output_size_per_partition = full.shape[1] // tp, full.shape[0]
        self.weight = _param(full.chunk(tp, dim=1)[rank], output_dim=0, input_dim=1)


class VocabParallelEmbedding(torch.nn.Module):
    """Rows org_vocab_start_index..end of the vocabulary, padded to a multiple of 8 rows per rank."""

    def __init__(self, full: torch.Tensor, rank: int, tp: int = 2):
        super().__init__()
        per = V // tp
        self.tp_size = tp
        self.shard_indices = type("Idx", (), {"org_vocab_start_index": rank * per,
                                              "org_vocab_end_index": (rank + 1) * per})()
        padded = torch.cat([full[rank * per:(rank + 1) * per], torch.full((4, H), 7.0)])  # padding rows
        self.weight = _param(padded, output_dim=0, input_dim=1)


class Norm(torch.nn.Module):
    def __init__(self, full: torch.Tensor):
        super().__init__()
        self.weight = _param(full)


def engine_model(full: dict, n_kv: int, rank: int, dtype=torch.float32):
    p = "model.layers.0."
    model = torch.nn.Module()
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    inner, layer, attn, mlp = torch.nn.Module(), torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    attn.qkv_proj = QKVParallelLinear(full, p + "self_attn", n_kv, rank)
    attn.o_proj = RowParallelLinear(full[p + "self_attn.o_proj.weight"], rank)
    mlp.gate_up_proj = MergedColumnParallelLinear(full, p + "mlp", rank)
    mlp.down_proj = RowParallelLinear(full[p + "mlp.down_proj.weight"], rank)
    layer.self_attn, layer.mlp = attn, mlp
    layer.input_layernorm = Norm(full[p + "input_layernorm.weight"])
    inner.embed_tokens = VocabParallelEmbedding(full["model.embed_tokens.weight"], rank)
    inner.layers = torch.nn.ModuleList([layer])
    model.model = inner
    return model.to(dtype)


def differing(verify, engine, full: dict, mode: str) -> list:
    from shim.engine import config

    params = {k: torch.nn.Parameter(v.clone()) for k, v in full.items()}
    desc = verify.describe(engine)
    names = verify._select(desc, params, mode)
    result = verify.fingerprint(engine, {"mode": mode, "names": names, "elements": verify.ELEMENTS})
    assert config.VERIFY_EXACT == "exact"
    return verify.compare([result], {desc["rank"]: desc}, {desc["rank"]: names}, params, mode), names


@pytest.mark.parametrize("n_kv", [2, 1], ids=["kv-split", "kv-replicated"])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_tp_shard_matches_its_slice_only(verify, n_kv, rank, mode):
    full = trainer_state(n_kv)
    engine = engine_model(full, n_kv, rank)
    diff, names = differing(verify, engine, full, mode)
    assert diff == []
    expected = {"model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
                "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
                "model.layers.0.mlp.down_proj.weight"}
    assert expected <= set(names)  # every sharded layout was understood
    if mode == "exact":
        assert {"model.layers.0.self_attn.qkv_proj.bias", "model.layers.0.input_layernorm.weight"} <= set(names)

    # One element changed in THIS rank's slice of each trainer tensor: the fused shard differs.
    kv_rank = rank // (2 // n_kv) if n_kv < 2 else rank
    for name, row, col in (("self_attn.k_proj.weight", kv_rank * HEAD * max(n_kv // 2, 1), 1),
                           ("mlp.up_proj.weight", rank * FF // 2 + 3, 2), ("self_attn.o_proj.weight", 5, rank * 8 + 1)):
        changed = {k: v.clone() for k, v in full.items()}
        key = "model.layers.0." + name
        if mode == "sample":
            changed[key] += 1.0  # every element: whatever the sample holds
        else:
            changed[key][row, col] += 0.5
        diff, _ = differing(verify, engine, changed, mode)
        fused = {"k_proj": "self_attn.qkv_proj", "up_proj": "mlp.gate_up_proj", "o_proj": "self_attn.o_proj"}
        part = next(v for k, v in fused.items() if k in name)
        assert diff == [f"model.layers.0.{part}.weight" + (f" (tp rank {rank})" if rank else "")], (name, diff)

    # The same change in the OTHER rank's slice is not this rank's business.
    other = 1 - rank
    changed = {k: v.clone() for k, v in full.items()}
    changed["model.layers.0.mlp.gate_proj.weight"][other * FF // 2:(other + 1) * FF // 2] += 1.0
    changed["model.layers.0.self_attn.q_proj.weight"][other * NH * HEAD // 2:(other + 1) * NH * HEAD // 2] += 1.0
    changed["model.embed_tokens.weight"][other * V // 2:(other + 1) * V // 2] += 1.0
    assert differing(verify, engine, changed, mode)[0] == []


def test_bf16_engine_compares_equal_to_float32_master_weights(verify):
    """The push rounds the trainer's float32 to the engine's bf16 (``param.copy_``): equal, not stale."""
    full = trainer_state(2)
    engine = engine_model(full, 2, 0, dtype=torch.bfloat16)
    for mode in ("sample", "exact"):
        assert differing(verify, engine, full, mode)[0] == []
    nudged = {k: v + 1e-6 for k, v in full.items()}  # below bf16 resolution: what the engine would hold anyway
    assert differing(verify, engine, nudged, "exact")[0] == []


# ---------------------------------------------------------------------------
# the check on an in-process engine: warning, rate limit, strict
# ---------------------------------------------------------------------------
class FakeLLM:
    """The attribute path TRL itself writes through: ``llm_engine.model_executor.driver_worker.model_runner.model``."""

    def __init__(self, model):
        runner = type("Runner", (), {"model": model})()
        worker = type("Worker", (), {"model_runner": runner})()
        executor = type("Executor", (), {"driver_worker": worker, "sleeping_tags": set(), "is_sleeping": False})()
        self.llm_engine = type("Engine", (), {"model_executor": executor})()


class Trainer:
    def __init__(self):
        self.state = type("State", (), {"global_step": 7})()

    def rollout(self, verify, llm, model):
        with verify.armed(llm, model, "Test.rollout"):
            verify.before_generate(llm)


@pytest.fixture
def pair():
    full = trainer_state(2)
    trainer = torch.nn.Module()
    trainer.model = torch.nn.Module()
    for k, v in full.items():  # the trainer model with the same names (parameters registered by path)
        *path, leaf = k.split(".")
        mod = trainer
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(v.clone()))
    return trainer, FakeLLM(engine_model(full, 2, 0))


@pytest.fixture
def warnings():
    from shim.engine import log

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    handler = Collect()
    log.get().addHandler(handler)
    yield seen
    log.get().removeHandler(handler)


def test_stale_warning_rate_limited_and_counted(verify, pair, warnings):
    trainer_model, llm = pair
    before = verify.counts()
    Trainer().rollout(verify, llm, trainer_model)
    assert warnings == [] and verify.counts()["verified"] == before["verified"] + 1
    with torch.no_grad():
        getattr(trainer_model.model.layers, "0").mlp.up_proj.weight.add_(0.25)  # a step the engine never got
    for _ in range(verify.WARN_FIRST + 7):
        Trainer().rollout(verify, llm, trainer_model)
    after = verify.counts()
    assert after["stale"] - before["stale"] == verify.WARN_FIRST + 7
    assert len(warnings) == verify.WARN_FIRST, warnings
    assert all("stale weights" in w and "step 7" in w and "model.layers.0.mlp.gate_up_proj.weight" in w
               and "(Test.rollout)" in w for w in warnings), warnings
    assert f"stale at {verify.WARN_FIRST} of {verify.WARN_FIRST + 1}" in warnings[-1]


def test_not_armed_or_off_is_not_verified(verify, pair, monkeypatch, warnings):
    trainer_model, llm = pair
    with torch.no_grad():
        getattr(trainer_model.model.layers, "0").mlp.up_proj.weight.add_(0.25)
    before = verify.counts()
    verify.before_generate(llm)  # a generate no trainer armed (the user's own LLM)
    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "0")
    Trainer().rollout(verify, llm, trainer_model)
    assert verify.counts()["stale"] == before["stale"] and warnings == []


def test_strict_raises(verify, pair, monkeypatch):
    trainer_model, llm = pair
    monkeypatch.setenv("SHIM_STRICT", "1")
    Trainer().rollout(verify, llm, trainer_model)  # equal: no error
    with torch.no_grad():
        trainer_model.model.embed_tokens.weight.mul_(2.0)
    with pytest.raises(verify.StaleWeights, match="stale weights at step 7"):
        Trainer().rollout(verify, llm, trainer_model)


def test_weights_asleep_at_generate_is_stale(verify, pair, warnings):
    trainer_model, llm = pair
    llm.llm_engine.model_executor.sleeping_tags = {"weights"}
    llm.llm_engine.model_executor.is_sleeping = True
    Trainer().rollout(verify, llm, trainer_model)
    assert warnings and "weights are asleep" in warnings[0]


@pytest.mark.parametrize("value,mode", [("1", "sample"), ("on", "sample"), ("exact", "exact"), ("0", ""), ("", "")])
def test_config_values(monkeypatch, value, mode):
    from shim.engine import config

    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", value)
    assert config.verify_weights() == mode


def test_config_bad_value(monkeypatch):
    from shim.engine import config

    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "maybe")
    with pytest.raises(config.ConfigError, match="SHIM_VERIFY_WEIGHTS='maybe' is not valid"):
        config.verify_weights()


# ---------------------------------------------------------------------------
# the real TRL trainer (stand-in engine)
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def trl(version: str, **env) -> dict:
    out = tempfile.mkdtemp(prefix=f"verify-{version}-")
    return run_trl(version, out, "--trainer", "grpo", "--shim", "before", env={"SHIM_VERIFY_WEIGHTS": "1", **env})


def test_trl_1_9_2_missing_push_reported():
    """#5312 fix switched off: every generate from the checkpoint after training is reported, nothing else."""
    r = trl("1.9.2", SHIM_DISABLED_PATCHES="trl-stale-weights")
    assert r["decisions"]["trl-stale-weights"].startswith("disabled")
    assert r["decisions"]["verify-weights-trl"] == "applied"
    assert r["from_checkpoint_after_training"] > 0  # the bug shows (the test's own observation)
    v = r["verify"]
    assert v["stale"] == r["mismatches"] > 0
    assert v["verified"] == len(r["generates"]) - r["mismatches"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert len(stale) == min(v["stale"], 5), r["shim_warnings"]
    assert all("LLMEngine#1" in w and "VLLMGeneration.generate" in w and "at step " in w for w in stale)
    assert any("at step 1" in w for w in stale)


def test_trl_1_9_2_with_fix_silent():
    r = trl("1.9.2")
    assert r["decisions"]["trl-stale-weights"] == "applied"
    assert r["mismatches"] == 0
    assert r["verify"] == {**r["verify"], "verified": 6, "stale": 0, "unverifiable": 0}
    assert not [w for w in r["shim_warnings"] if "stale weights" in w]


def test_trl_1_10_0_verified_where_no_fix_applies():
    r = trl("1.10.0")
    assert r["decisions"]["trl-stale-weights"].startswith("stand down")
    assert r["decisions"]["verify-weights-trl"] == "applied"
    assert r["verify"]["verified"] == 6 and r["verify"]["stale"] == 0


def test_trl_1_9_2_strict_stops_the_run():
    r = trl("1.9.2", SHIM_DISABLED_PATCHES="trl-stale-weights", SHIM_STRICT="1")
    assert r["error"] and r["error"].startswith("StaleWeights: [shim] verify-weights LLMEngine#1"), r["error"]
    assert r["verify"]["stale"] == 1


def test_trl_1_9_2_exact_mode():
    r = trl("1.9.2", SHIM_DISABLED_PATCHES="trl-stale-weights", SHIM_VERIFY_WEIGHTS="exact")
    assert r["verify"]["stale"] == r["mismatches"] > 0
    assert r["verify"]["verified"] == len(r["generates"]) - r["mismatches"]


def test_tied_embeddings_compared_once(verify, pair, warnings):
    """``lm_head`` sharing ``embed_tokens``' parameter (HF and vLLM ``tie_word_embeddings``): one tensor,
    compared once, under its first name (the stand-in dry run of the GPU bench failed on this)."""
    trainer_model, llm = pair
    engine = llm.llm_engine.model_executor.driver_worker.model_runner.model
    for model, inner in ((engine, engine.model), (trainer_model, trainer_model.model)):
        model.lm_head = torch.nn.Module()
        model.lm_head.weight = inner.embed_tokens.weight
    before = verify.counts()
    Trainer().rollout(verify, llm, trainer_model)
    assert warnings == [] and verify.counts()["verified"] == before["verified"] + 1
    assert "lm_head.weight" not in verify.describe(engine)["params"]


# ---------------------------------------------------------------------------
# the real ms-swift rollout mixin (stand-in engine)
# ---------------------------------------------------------------------------
def swift(version: str, **env) -> dict:
    from tests.support.swift_support import run_swift

    return run_swift(version, "--level", "2", "--shim", env={"SHIM_VERIFY_WEIGHTS": "1", **env})


def test_swift_3_10_1_level2_gap_reported():
    r = swift("3.10.1", SHIM_DISABLED_PATCHES="swift-level2-resync")
    assert r["decisions"]["verify-weights-swift"] == "applied"
    assert r["mismatches"] > 0  # the level-2 gap shows (the test's own observation)
    assert r["verify"]["stale"] == r["mismatches"]
    assert r["verify"]["verified"] == len(r["generates"]) - r["mismatches"]


def test_swift_3_10_1_with_fix_and_4_6_0_silent():
    for version, key in (("3.10.1", "verify-weights-swift"), ("4.6.0", "verify-weights-swift-4x")):
        r = swift(version)
        assert r["decisions"][key] == "applied"
        assert r["mismatches"] == 0
        assert r["verify"]["verified"] == len(r["generates"]) > 0 and r["verify"]["stale"] == 0, (version, r["verify"])


@pytest.mark.parametrize("version,trainer,fix", [("0.27.2", "grpo", "trl-grpo-level2-resync"),
                                                 ("1.9.2", "online_dpo", "trl-online-dpo-resync")])
def test_other_trl_sites_report_their_gap(version, trainer, fix):
    """The arming records of GRPO 0.25-0.27 and OnlineDPO: the release's own gap (its fix switched off) is
    reported at exactly the rollouts the observation finds stale; with the fix on nothing is."""
    out = tempfile.mkdtemp(prefix=f"verify-{version}-{trainer}-")
    off = run_trl(version, out, "--trainer", trainer, "--shim", "before",
                  env={"SHIM_VERIFY_WEIGHTS": "1", "SHIM_DISABLED_PATCHES": fix})
    assert off["mismatches"] > 0
    assert off["verify"]["stale"] == off["mismatches"]
    assert off["verify"]["verified"] == len(off["generates"]) - off["mismatches"]
    on = run_trl(version, tempfile.mkdtemp(prefix="verify-on-"), "--trainer", trainer, "--shim", "before",
                 env={"SHIM_VERIFY_WEIGHTS": "1"})
    assert on["mismatches"] == 0 and on["verify"]["stale"] == 0 and on["verify"]["verified"] == len(on["generates"])
