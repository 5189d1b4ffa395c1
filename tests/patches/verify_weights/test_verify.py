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
    v.reset()
    yield v
    v.reset()


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


def differing(engine, full: dict) -> tuple:
    """One check of every mapped tensor: the engine's digests (on its worker) against the trainer's."""
    from shim.verify import compare, layout

    params = {k: torch.nn.Parameter(v.clone()) for k, v in full.items()}
    desc = layout.describe(engine)
    names, _ = layout.mapped(desc, params)
    result = compare.fingerprint(engine, {"names": names})
    return compare.compare([result], {desc["rank"]: desc}, names, params), names


@pytest.mark.parametrize("n_kv", [2, 1], ids=["kv-split", "kv-replicated"])
@pytest.mark.parametrize("rank", [0, 1])
def test_tp_shard_matches_its_slice_only(n_kv, rank):
    full = trainer_state(n_kv)
    engine = engine_model(full, n_kv, rank)
    diff, names = differing(engine, full)
    assert diff == []
    assert {"model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
            "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.qkv_proj.bias",
            "model.layers.0.input_layernorm.weight"} <= set(names)  # every sharded layout was understood

    # One element changed in THIS rank's slice of each trainer tensor: that engine shard differs. The
    # vocabulary change is on the slice's LAST row (a slice one row short would miss it).
    kv_rank = rank // (2 // n_kv) if n_kv < 2 else rank
    for name, row, col in (("model.layers.0.self_attn.k_proj.weight", kv_rank * HEAD * max(n_kv // 2, 1), 1),
                           ("model.layers.0.mlp.up_proj.weight", rank * FF // 2 + 3, 2),
                           ("model.layers.0.self_attn.o_proj.weight", 5, rank * 8 + 1),
                           ("model.embed_tokens.weight", (rank + 1) * V // 2 - 1, 3)):
        changed = {k: v.clone() for k, v in full.items()}
        changed[name][row, col] += 0.5
        diff, _ = differing(engine, changed)
        fused = {"k_proj": "model.layers.0.self_attn.qkv_proj", "up_proj": "model.layers.0.mlp.gate_up_proj",
                 "o_proj": "model.layers.0.self_attn.o_proj", "embed_tokens": "model.embed_tokens"}
        part = next(v for k, v in fused.items() if k in name)
        assert diff == [f"{part}.weight" + (f" (tp rank {rank})" if rank else "")], (name, diff)

    # The same change in the OTHER rank's slice is not this rank's business.
    other = 1 - rank
    changed = {k: v.clone() for k, v in full.items()}
    changed["model.layers.0.mlp.gate_proj.weight"][other * FF // 2:(other + 1) * FF // 2] += 1.0
    changed["model.layers.0.self_attn.q_proj.weight"][other * NH * HEAD // 2:(other + 1) * NH * HEAD // 2] += 1.0
    changed["model.embed_tokens.weight"][other * V // 2:(other + 1) * V // 2] += 1.0
    assert differing(engine, changed)[0] == []


def test_kept_views_follow_replaced_and_repointed_parameters():
    """From one check to the next the engine's description and both sides' views are kept
    (``compare.described``, ``compare.Views``); a parameter replaced (``module.weight = ...``, as a
    layerwise reload does) or re-pointed (``param.data = ...``) on either side must be read afresh:
    a kept view of the old tensor would report a push that landed as stale, or miss one that did not."""
    from shim.verify import compare, layout

    full = trainer_state(2)
    engine = engine_model(full, 2, 0)
    trainer = {k: torch.nn.Parameter(v.clone()) for k, v in full.items()}
    desc = layout.describe(engine)
    names, _ = layout.mapped(desc, trainer)
    kept = compare.Views()

    def check():
        result = compare.fingerprint(engine, {"names": names})
        return compare.compare([result], {desc["rank"]: desc}, names, trainer, None, kept)

    assert check() == []
    down = engine.get_submodule("model.layers.0.mlp.down_proj")
    norm = engine.get_submodule("model.layers.0.input_layernorm")
    old_down, old_norm = down.weight, norm.weight.data
    down.weight = _param(old_down.detach() + 1.0)  # the engine's parameter replaced
    norm.weight.data = norm.weight.data + 1.0  # the engine's parameter re-pointed
    assert check() == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight"]
    down.weight = old_down
    norm.weight.data = old_norm
    assert check() == []
    key = "model.layers.0.self_attn.o_proj.weight"
    trainer[key].data = trainer[key].data + 1.0  # the trainer's parameter re-pointed
    trainer["model.layers.0.input_layernorm.weight"] = torch.nn.Parameter(full["model.layers.0.input_layernorm.weight"]
                                                                          + 1.0)  # and one replaced
    assert check() == ["model.layers.0.self_attn.o_proj.weight", "model.layers.0.input_layernorm.weight"]


def test_bf16_engine_compares_equal_to_float32_master_weights():
    """The push rounds the trainer's float32 to the engine's bf16 (``param.copy_``): equal, not stale."""
    full = trainer_state(2)
    engine = engine_model(full, 2, 0, dtype=torch.bfloat16)
    assert differing(engine, full)[0] == []
    nudged = {k: v + 1e-6 for k, v in full.items()}  # below bf16 resolution: what the engine would hold anyway
    assert differing(engine, nudged)[0] == []


def test_bf16_engine_small_change_is_stale():
    """A bf16 weight the trainer moved by one bf16 step (0.30078125 -> 0.302734375) differs in its bit pattern
    while its value, cast to an integer, stays 0: compared by value it would pass as equal."""
    full = trainer_state(2)
    key = "model.layers.0.mlp.gate_proj.weight"
    full[key][2, 3] = 0.30078125
    engine = engine_model(full, 2, 0, dtype=torch.bfloat16)
    assert differing(engine, full)[0] == []
    changed = {k: v.clone() for k, v in full.items()}
    changed[key][2, 3] = 0.302734375  # the next bf16 value (one step of 2**-9)
    old, new = (torch.tensor(x).to(torch.bfloat16) for x in (0.30078125, 0.302734375))
    assert old != new and int(old.float()) == int(new.float()) == 0  # the bug a value cast would have
    assert differing(engine, changed)[0] == ["model.layers.0.mlp.gate_up_proj.weight"]


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


# ---------------------------------------------------------------------------
# the digest: the definition, every single change, permutations, chunking, routes
# ---------------------------------------------------------------------------
def test_digest_is_the_definition():
    from shim.verify import digest

    g = torch.Generator().manual_seed(1)
    base = torch.randn(64, 200, generator=g)
    cases = [(torch.randn(37, 51, generator=g), torch.bfloat16), (torch.randn(5, generator=g), torch.float16),
             (torch.tensor(3.0), torch.bfloat16), (base.narrow(1, 100, 100), torch.bfloat16),  # a strided slice
             (torch.randn(9, 700, generator=g), torch.float32)]
    got = digest.digests([t for t, _ in cases], [d for _, d in cases])
    assert got == [digest.reference(t, d) for t, d in cases]
    assert got[0] == digest.digests([cases[0][0].to(torch.bfloat16)])[0]  # rounded as the push's copy_ rounds
    assert len(got[0]) == digest.COLS and len(set(map(tuple, got))) == len(got)


def test_digest_sees_every_single_change_and_permutations():
    from shim.verify import digest

    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 1500, generator=g).to(torch.bfloat16)  # 9000 bytes: three hash rows
    flat = x.reshape(-1)
    changed = []
    for i in range(flat.numel()):  # every element, one bf16 step up
        y = flat.clone()
        y[i] = torch.nextafter(y[i].float(), torch.tensor(float("inf"))).to(torch.bfloat16) \
            if y[i].float().nextafter(torch.tensor(float("inf"))).to(torch.bfloat16) != y[i] \
            else (y[i].float() * 1.01).to(torch.bfloat16)
        changed.append(y.view(3, 1500))
    want = digest.digests([x])[0]
    assert all(d != want for d in digest.digests(changed))
    swaps = []
    for i, j in ((0, 1), (10, 2058), (5, 1505), (0, 4499)):  # neighbours, one hash row apart, a tensor row apart
        y = flat.clone()
        y[i], y[j] = flat[j], flat[i]
        assert y.float().sum() == flat.float().sum() and not torch.equal(y, flat)  # a plain sum misses it
        swaps.append(y.view(3, 1500))
    assert all(d != want for d in digest.digests(swaps))


def test_digest_chunked_and_every_route_agree(monkeypatch):
    """Chunked (one hash row per step) equals whole; every route usable here equals the definition
    (the CUDA route is checked against the CPU by :func:`shim.verify.digest.route` itself)."""
    from shim.verify import digest, digest_rows

    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(300, 64, generator=g), torch.randn(7, generator=g), torch.randn(40, 96, generator=g)]
    want = [digest.reference(t, torch.bfloat16) for t in ts]
    monkeypatch.setattr(digest_rows, "CHUNK_ROWS", 1)  # the first tensor (19200 bf16 words) in 19 chunks
    assert digest.partials(ts[0], torch.bfloat16).shape[0] == 19
    ran = []
    for name in digest.ROUTES:
        monkeypatch.setattr(digest, "ROUTE", name)
        try:
            got = digest.digests(ts, [torch.bfloat16] * 3)
        except ImportError:  # triton: CUDA builds only
            continue
        assert got == want, name
        ran.append(name)
    assert "torch" in ran


def test_sample_rows_are_exact_and_cover_every_row_over_passes():
    """Sample mode digests strided rows exactly (one changed element in them shows); the starting
    row moves on with each pass, so ``stride`` passes cover every row of a tensor."""
    from shim.verify import compare, digest

    t = torch.randn(1000, 64)
    stride = None
    seen = set()
    for phase in range(64):
        view = compare.rows(t, 64 * 100, phase)
        stride = stride or view.stride(0) // t.stride(0)
        assert view.shape[0] * 64 <= 64 * 100 + 64 * stride and view.data_ptr() >= t.data_ptr()
        seen.update(range(phase % stride, 1000, stride))
    assert digest.digests([view]) == [digest.reference(view)]
    assert stride == 10 and seen == set(range(1000))
    assert compare.sample(0, 17, 8) == [compare.ELEMENTS, 0] and compare.sample(3, 17, 8)[1] == 1
    changed = t.clone()
    changed[7, 3] += 1
    assert digest.digests([compare.rows(changed, 6400, 7)]) != digest.digests([compare.rows(t, 6400, 7)])
    assert digest.digests([compare.rows(changed, 6400, 8)]) == digest.digests([compare.rows(t, 6400, 8)])


# ---------------------------------------------------------------------------
# sample mode rotates; a tensor the push never wrote is found
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("per", [1, 3, 8])
def test_window_covers_every_tensor_within_ceil(per):
    import math

    from shim.verify import compare

    for n in range(1, 30):
        names = [f"t{i}" for i in range(n)]
        span = math.ceil(n / per)
        for first in range(2 * span + 1):
            seen = set()
            for check in range(first, first + span):
                window = compare.window(names, check, per)
                assert len(window) == min(per, n)
                seen.update(window)
            assert seen == set(names), (n, per, first)


@pytest.mark.parametrize("mode", ["sample", "exact"])
def test_tensor_never_pushed_is_found(verify, pair, warnings, monkeypatch, mode):
    """The engine's ``input_layernorm`` keeps what it held (a push that missed it): exact reports it
    at the first check, sample within ceil(mapped / TENSORS) checks, whichever slice it starts at."""
    import math

    from shim.verify import compare

    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", mode)
    monkeypatch.setattr(compare, "TENSORS", 2)  # 7 mapped tensors here: 4 slices
    trainer_model, llm = pair
    engine = llm.llm_engine.model_executor.driver_worker.model_runner.model
    with torch.no_grad():
        getattr(engine.model.layers, "0").input_layernorm.weight.add_(0.5)
    Trainer().rollout(verify, llm, trainer_model)
    target = verify.target_for(llm)
    span = 1 if mode == "exact" else math.ceil(len(target.mapped) / compare.TENSORS)
    assert span == (1 if mode == "exact" else 4)
    for _ in range(span - 1):
        Trainer().rollout(verify, llm, trainer_model)
    assert target.stale >= 1 and any("input_layernorm" in w for w in warnings), (target.mapped, warnings)
    if mode == "exact":
        assert target.stale == 1 and len(warnings) == 1


# ---------------------------------------------------------------------------
# never silently off
# ---------------------------------------------------------------------------
class RemoteLLM:
    """An engine in other processes: no in-process worker; ``apply_model`` refuses to ship a function,
    as vLLM's ``collective_rpc`` does without VLLM_ALLOW_INSECURE_SERIALIZATION."""

    def __init__(self):
        executor = type("Executor", (), {"sleeping_tags": set(), "is_sleeping": False})()
        self.llm_engine = type("Engine", (), {"model_executor": executor})()

    def apply_model(self, func):
        raise TypeError("Object of type <class 'functools.partial'> is not serializable")


def test_engine_in_another_process_counted_every_rollout(verify, pair, warnings):
    trainer_model, _ = pair
    llm = RemoteLLM()
    before = verify.counts()["unverifiable"]
    for _ in range(3):
        Trainer().rollout(verify, llm, trainer_model)
    assert verify.counts()["unverifiable"] - before == 3
    assert len(warnings) == 1 and "not running" in warnings[0] and "VLLM_ALLOW_INSECURE_SERIALIZATION" in warnings[0]
    from shim.engine.patch import Decision

    applied = {"verify-weights-vllm": Decision("applied"), "verify-weights-trl": Decision("applied")}
    assert "another process" in verify.not_running_reason("verify-weights-trl", applied)


def test_unmapped_engine_tensor_is_a_warning(verify, pair, warnings):
    trainer_model, llm = pair
    engine = llm.llm_engine.model_executor.driver_worker.model_runner.model
    engine.model.extra_scale = torch.nn.Parameter(torch.ones(4), requires_grad=False)  # no trainer tensor
    Trainer().rollout(verify, llm, trainer_model)
    Trainer().rollout(verify, llm, trainer_model)
    assert len(warnings) == 1 and "model.extra_scale" in warnings[0] and "not verified" in warnings[0], warnings
    assert verify.target_for(llm).generates == 2  # the rest is verified


def test_peft_trainer_unverifiable_warned_once_counted_always(verify, pair, warnings):
    trainer_model, llm = pair
    trainer_model.peft_config = {"default": object()}
    before = verify.counts()["unverifiable"]
    for _ in range(2):
        Trainer().rollout(verify, llm, trainer_model)
    assert verify.counts()["unverifiable"] - before == 2
    assert len(warnings) == 1 and "PEFT" in warnings[0], warnings


def test_not_running_reason(verify, monkeypatch):
    from shim.engine.patch import Decision

    shape = Decision("stand down", "upstream shape changed: LLM.generate/chat not found")
    d = {"verify-weights-vllm": shape, "verify-weights-trl": Decision("applied"),
         "verify-weights-trl-grpo": Decision("stand down", "version not in >=0.25.0,<0.28.0"),
         "verify-weights-swift-4x": Decision("applied")}
    assert "verify-weights-vllm stand down: upstream shape changed" in verify.not_running_reason("verify-weights-trl", d)
    assert "upstream shape changed" in verify.not_running_reason("verify-weights-vllm", d)
    assert verify.not_running_reason("verify-weights-trl-grpo", d) is None  # another release's record
    assert verify.not_running_reason("verify-weights-swift-4x", d) is None  # checks on its own
    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "0")
    assert verify.not_running_reason("verify-weights-trl", d) is None  # not asked for


def test_armed_window_without_a_check_is_unverifiable(verify, pair, warnings, monkeypatch):
    """The trainer half armed the engine but no check ran (its vLLM half stood down)."""
    from shim.engine.patch import Decision

    trainer_model, llm = pair
    monkeypatch.setattr(verify, "_decisions", lambda: {
        "verify-weights-vllm": Decision("stand down", "upstream shape changed: LLM.chat not found"),
        "verify-weights-trl": Decision("applied")})
    before = verify.counts()["unverifiable"]
    for _ in range(2):
        with verify.armed(llm, trainer_model, "Test.rollout"):
            pass  # LLM.generate ran unwrapped
    assert verify.counts()["unverifiable"] - before == 2
    assert len(warnings) == 1 and "LLM.chat not found" in warnings[0], warnings


# ---------------------------------------------------------------------------
# weight version (vLLM >= 0.27.0: LLMEngine.set_weight_version / get_weight_version)
# ---------------------------------------------------------------------------
def test_weight_version_tagged_and_named(verify, pair, warnings, monkeypatch, tmp_path):
    import json

    trainer_model, llm = pair
    engine = llm.llm_engine
    engine._weight_version = "default"  # vllm/v1/engine/core.py 0.27.0: EngineCore._weight_version
    type(engine).set_weight_version = lambda self, v: setattr(self, "_weight_version", v)
    type(engine).get_weight_version = lambda self: self._weight_version
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SHIM_TRACE", str(trace))
    Trainer().rollout(verify, llm, trainer_model)
    assert engine.get_weight_version() == "7"
    trainer = Trainer()
    trainer.state.global_step = 8
    with torch.no_grad():
        trainer_model.model.embed_tokens.weight.mul_(2.0)
    trainer.rollout(verify, llm, trainer_model)
    assert engine.get_weight_version() == "7"  # not moved by a stale check
    assert len(warnings) == 1 and "stale weights at step 8 (engine weight version 7)" in warnings[0], warnings
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["event"], r["verdict"], r["step"], r["weight_version"]) for r in recs] == [
        ("verify", "verified", 7, "7"), ("verify", "stale", 8, "7")]


@pytest.mark.parametrize("value,mode", [("1", "exact"), ("on", "exact"), ("exact", "exact"), ("sample", "sample"),
                                        ("0", ""), ("", "")])
def test_config_values(monkeypatch, value, mode):
    from shim.engine import config

    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", value)
    assert config.verify_weights() == mode


def test_config_bad_value(monkeypatch):
    from shim.engine import config, log

    log.forget("switch")
    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "maybe")
    with pytest.raises(config.ConfigError, match="SHIM_VERIFY_WEIGHTS='maybe' is not valid"):
        config.validate()
    assert config.verify_weights() == config.VERIFY_OFF  # read: off, one WARNING


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


SKIPPED = "model.layers.1.self_attn.v_proj.weight"
"""The tensor the partial push leaves out: not among the 8 fixed matrices the old sampled mode compared
on this model (q_proj, v_proj, gate_proj, down_proj of layer 0, k_proj, o_proj, up_proj of layer 1, lm_head),
so that mode never saw it; nor in the first slice of 8 (a rotation stuck on one slice misses it too)."""


@functools.lru_cache(maxsize=None)
def partial_push(mode: str) -> dict:
    return run_trl("1.10.0", tempfile.mkdtemp(prefix=f"verify-partial-{mode}-"), "--trainer", "grpo",
                   "--shim", "before", "--skip-push", SKIPPED, env={"SHIM_VERIFY_WEIGHTS": mode})


def test_trl_1_10_0_partial_push_exact_every_rollout():
    """Every push misses one tensor; level 2 leaves it discarded: exact reports every rollout at once."""
    r = partial_push("exact")
    assert r["decisions"]["verify-weights-trl"] == "applied"
    assert r["mismatches"] == len(r["generates"]) > 0  # the bug shows (the test's own observation)
    assert r["verify"]["stale"] == r["mismatches"] and r["verify"]["verified"] == 0
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    assert stale and all(SKIPPED in w for w in stale) and "stale at 1 of 1 " in stale[0], stale


def test_trl_1_10_0_partial_push_sample_within_its_window():
    """Sample mode: the skipped tensor is in one slice of every ceil(mapped / 8) consecutive checks."""
    import math
    import re

    r = partial_push("sample")
    assert r["mismatches"] == len(r["generates"]) > 0
    info = next(m for lvl, m in r["shim_log"] if "comparing" in m)
    mapped = int(re.search(r"comparing (\d+) of", info).group(1))
    span = math.ceil(mapped / 8)
    checks = r["verify"]["stale"] + r["verify"]["verified"]
    assert checks == len(r["generates"]) >= span, (info, r["verify"])
    assert r["verify"]["stale"] >= checks // span > 0, r["verify"]
    stale = [w for w in r["shim_warnings"] if "stale weights" in w]
    first = int(re.search(r"stale at 1 of (\d+) ", stale[0]).group(1))
    assert first <= span and SKIPPED in stale[0], stale[0]


def test_trl_1_10_0_engine_half_standing_down_is_loud():
    """An ``LLM`` without ``chat``: the vLLM half stands down by its probe, the trainer half applies; every
    rollout is unverifiable, one WARNING says why, the status reason names it."""
    r = run_trl("1.10.0", tempfile.mkdtemp(prefix="verify-nochat-"), "--trainer", "grpo", "--shim", "after",
                "--drop-llm-chat", env={"SHIM_VERIFY_WEIGHTS": "1"})
    assert r["decisions"]["verify-weights-vllm"] == "stand down: upstream shape changed: LLM.chat not found"
    assert r["decisions"]["verify-weights-trl"] == "applied"
    assert r["verify"]["verified"] == r["verify"]["stale"] == 0
    assert r["verify"]["unverifiable"] == len(r["generates"]) > 0
    loud = [w for w in r["shim_warnings"] if "not running" in w]
    assert len(loud) == 1 and "LLM.chat not found" in loud[0], r["shim_warnings"]
    assert "verify-weights-vllm stand down: upstream shape changed" in r["not_running"]["verify-weights-trl"]
    assert r["metrics"] and r["metrics"][-1].get("shim/rollouts_unverifiable") == len(r["generates"]), r["metrics"]


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
    from shim.verify import layout

    assert "lm_head.weight" not in layout.describe(engine)["params"]


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
