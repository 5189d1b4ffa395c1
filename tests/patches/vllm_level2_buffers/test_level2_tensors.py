"""A level-2 sleep loses plain tensor attributes (patches/vllm_level2_buffers.py ``vllm-level2-tensors``).

vLLM's ``Worker.sleep(level=2)`` saves ``named_buffers()`` only. A tiny DeepSeek-V2 on the stand-in with
a quantized ``kv_b_proj`` (``FAKEVLLM_QUANTIZATION=fp8``) keeps MLA's ``W_UK_T`` / ``W_UV`` as plain
attributes of its own storage in the weights pool (vLLM 0.24 ``MLAAttention.process_weights_after_loading``;
on ``layer.impl`` up to 0.15): the sleep discards them, the wake maps undefined pages under them, and a
trainer's push (parameters only, raw ``load_weights``) does not rewrite them. Here the push writes the
weights the engine already had, so the engine must generate as before the sleep.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.stand_in import run

BODY = Path(__file__).parent / "children" / "plain_tensors.py"  # a stand_in body
ATTRIBUTE = Path(__file__).parent / "children" / "plain_attribute.py"  # a stand_in body


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_mla_model

    return make_tiny_mla_model(str(tmp_path_factory.mktemp("mla") / "m"), seed=0)


def both(model_dir, **kw):
    off, _ = run(model_dir, BODY, shim=False, FAKEVLLM_QUANTIZATION="fp8", **kw)
    on, proc = run(model_dir, BODY, shim=True, FAKEVLLM_QUANTIZATION="fp8", **kw)
    return off, on, proc


def test_cuda_plain_tensors_survive_level2(model_dir):
    off, on, proc = both(model_dir)
    assert off["view"] is False
    assert off["derived_back"] is False and off["same_output"] is False  # the bug
    assert on["derived_back"] is True and on["same_output"] is True, proc.stderr
    # the shim's sleep line counts them: 2 layers x one dequantized [N*(P+V), L] float32 copy (2 KiB each)
    assert len(on["kept_lines"]) == 1 and "plain tensors kept: 2 storage(s), 4096 bytes" in on["kept_lines"][0]
    disabled, _ = run(model_dir, BODY, shim=True, FAKEVLLM_QUANTIZATION="fp8",
                      SHIM_DISABLED_PATCHES="vllm-level2-tensors")
    assert disabled["derived_back"] is False


def test_cuda_kv_cache_first_wake(model_dir):
    """The restore waits for the weights tag (a kv_cache-first wake would write into unmapped pages). Without
    the shim this order faults in vLLM's own buffer restore (vllm#45619, ``vllm-level2-buffers``), so the
    failing half is the shim with this patch disabled."""
    env = dict(FAKEVLLM_QUANTIZATION="fp8", TEST_ORDER="kv_cache")
    off, _ = run(model_dir, BODY, shim=True, SHIM_DISABLED_PATCHES="vllm-level2-tensors", **env)
    assert off["derived_back"] is False
    on, proc = run(model_dir, BODY, shim=True, **env)
    assert on["derived_back"] is True and on["same_output"] is True, proc.stderr


def test_npu_plain_tensors_survive_level2(model_dir):
    off, _ = run(model_dir, BODY, shim=False, device="npu", FAKEVLLM_QUANTIZATION="fp8")
    on, proc = run(model_dir, BODY, shim=True, device="npu", FAKEVLLM_QUANTIZATION="fp8")
    assert off["derived_back"] is False
    assert on["derived_back"] is True and on["same_output"] is True, proc.stderr
    disabled, _ = run(model_dir, BODY, shim=True, device="npu", FAKEVLLM_QUANTIZATION="fp8",
                      SHIM_DISABLED_PATCHES="vllm-ascend-level2-tensors")
    assert disabled["derived_back"] is False


def test_vllm_010_matrices_on_the_impl(model_dir):
    """Up to vLLM 0.15 the matrices live on the attention backend object (``layer.impl``)."""
    off, _ = run(model_dir, BODY, shim=False, version="0.10.2", FAKEVLLM_QUANTIZATION="fp8")
    on, proc = run(model_dir, BODY, shim=True, version="0.10.2", FAKEVLLM_QUANTIZATION="fp8")
    assert off["derived_back"] is False
    assert on["derived_back"] is True and on["same_output"] is True, proc.stderr


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("dense") / "m"), seed=0)


def test_vllm_033_plain_attribute_lost_without_the_shim(dense_dir):
    """0.33: the level-2 sleep saves buffers (and preserved parameters), not a plain attribute in the weights
    pool (``set_default_quant_scales(register_buffer=False)``'s ``q_range`` ...)."""
    off, _ = run(dense_dir, ATTRIBUTE, shim=False, version="0.33.0")
    assert off["attribute_back"] is False and off["buffers_back"] is True  # the bug
    on, proc = run(dense_dir, ATTRIBUTE, shim=True, version="0.33.0")
    assert on["attribute_back"] is True and on["same_output"] is True, proc.stderr
    assert on["decision"] == "applied" and on["alarm_names_it"] is False


def test_vllm_034_keeps_plain_attributes_itself(dense_dir):
    """0.34 fixed vllm#53343 (``Worker._discardable_parameters`` + ``discardable_allocations``): only the
    allocations holding nothing but parameters are discarded, the buffers and the plain attribute are offloaded
    and restored -- without the shim. The record stands down as fixed upstream (never "shape changed"), so the
    stale-rollout alarm does not name it as a patch not acting."""
    off, proc = run(dense_dir, ATTRIBUTE, shim=False, version="0.34.0")
    assert off["params_discarded"] is True and off["discarded_allocations"] == 1, proc.stderr  # level 2 still
    assert off["attribute_back"] is True and off["buffers_back"] is True and off["same_output"] is True
    assert off["saved_buffers_attr"] is False  # _sleep_saved_buffers is gone in 0.34
    on, proc = run(dense_dir, ATTRIBUTE, shim=True, version="0.34.0")
    assert on["decision"] == "stand down: fixed upstream in 0.34.0", proc.stderr
    assert on["alarm_names_it"] is False
    assert on["attribute_back"] is True and on["same_output"] is True


def test_views_of_parameters_are_not_copied(model_dir):
    """Unquantized: W_UV is a view of kv_b_proj.weight; the push rewrites it, nothing is kept."""
    on, proc = run(model_dir, BODY, shim=True)
    assert on["view"] is True and on["derived_back"] is True and on["same_output"] is True, proc.stderr
    assert on["kept_lines"] == []


def test_not_kept_where_the_push_rederives(model_dir):
    """After a push through vLLM's reload (shim.vllm.weights.reload), the attention layers' attributes are derived
    again by the next push: not copied (a raw push, as here, then leaves them as the wake found them)."""
    on, proc = run(model_dir, BODY, shim=True, FAKEVLLM_QUANTIZATION="fp8", TEST_SESSION="1")
    assert on["kept_lines"] == [], proc.stderr
    assert on["derived_back"] is False


def test_probe_stands_down_where_sleep_saves_module_attributes():
    from shim.vllm.weights import buffers

    class Worker:
        def sleep(self, level=1):
            if level == 2:
                self._sleep_saved_buffers = {n: b.cpu() for n, b in self.model.named_buffers()}

        def wake_up(self, tags=None):
            pass

    class Fixed(Worker):
        def sleep(self, level=1):
            if level == 2:
                self._sleep_saved_buffers = {n: b.cpu() for n, b in self.model.named_buffers()}
                self._saved = {m: dict(vars(m)) for m in self.model.modules()}

        def wake_up(self, tags=None):
            pass

    class Delegates(Worker):
        def sleep(self, level=1):
            super().sleep(level)

        def wake_up(self, tags=None):
            pass

    class Inherits(Worker):
        pass

    class Discards(Worker):  # vLLM 0.34: the sleep names the parameters it may discard, saves nothing itself
        def _discardable_parameters(self, model):
            return set()

        def sleep(self, level=1):
            pass

        def wake_up(self, tags=None):
            pass

    assert buffers.probe_plain(Worker) is None
    assert buffers.probe_plain(Delegates) is None  # vllm-ascend style: its sleep, the save through super()
    assert buffers.probe_plain(Fixed).startswith("fixed upstream")
    assert buffers.probe_plain(Inherits).startswith("upstream shape changed")
    assert buffers.probe_plain(Discards) == buffers.FIXED_034  # a 0.34 pre-release, inside the range


def test_selection_skips_views_and_what_the_next_push_rederives(monkeypatch):
    """Which storages a level-2 sleep copies (``shim.vllm.weights.buffers._plain_to_keep``), on a small module tree
    whose every storage lies in the weights pool (the stand-in keeps parameters in one fake allocation,
    so the view rule is checked here): a plain tensor of its own storage is kept once (two views of one
    storage, one copy); views of a parameter or a buffer are not; an attention layer's attributes are not
    once the pushes into the model re-run its post-processing."""
    import types

    import torch

    from shim.vllm.sleep import sleep_pool
    from shim.vllm.weights import buffers
    from shim.vllm.weights.tensors import REPROCESSED

    attention = types.ModuleType("vllm.model_executor.layers.attention")

    class MLAAttention(torch.nn.Module):
        pass

    attention.Attention, attention.MLAAttention = type("Attention", (torch.nn.Module,), {}), MLAAttention
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.attention", attention)

    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.proj.register_buffer("table", torch.arange(4.0))
    model.proj.weight_t = model.proj.weight.T          # view of a parameter
    model.proj.table_view = model.proj.table[1:]       # view of a buffer
    own = torch.randn(8)
    model.proj.own, model.proj.own_half = own, own[:4]  # one storage, two attributes
    model.mla = MLAAttention()
    model.mla.W_UV = torch.randn(3, 2)
    tensors = [model.proj.weight, model.proj.table, own, model.mla.W_UV]
    monkeypatch.setattr(sleep_pool, "spans", lambda tag: [(t.untyped_storage().data_ptr(),
                                                          t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                                                         for t in tensors])
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))

    def kept():
        return sorted(ptr for ptr, _ in buffers._plain_to_keep(worker))

    ptr = {name: t.untyped_storage().data_ptr() for name, t in (("own", own), ("W_UV", model.mla.W_UV))}
    assert kept() == sorted([ptr["own"], ptr["W_UV"]])
    setattr(model, REPROCESSED, True)
    assert kept() == [ptr["own"]]


ROPE = Path(__file__).parent / "children" / "ascend_rope.py"  # a stand_in body


def test_npu_ascend_rope_caches_survive_level2(model_dir):
    """vllm-ascend 0.23.0 keeps the MLA rope caches as module globals (``vllm_ascend/ops/rotary_embedding.py``
    ``_cos_cache`` / ``_sin_cache``, two halves of one tensor made in the weights pool by
    ``AscendRotaryEmbedding.__init__``); its level-2 sleep saves the buffers only, and the MLA path reads the
    caches at every step. The push writes the weights the engine already had: the output must not change."""
    off, proc_off = run(model_dir, ROPE, shim=False, device="npu", ascend="0.23.0")
    assert off is not None, proc_off.stderr[-2000:]
    assert off["recorded"] is True and off["one_storage"] is True
    assert off["back"] == {"_cos_cache": False, "_sin_cache": False, "_cos_sin_cache": True}  # the bug
    assert off["same_output"] is False
    on, proc = run(model_dir, ROPE, shim=True, device="npu", ascend="0.23.0")
    assert on is not None, proc.stderr[-2000:]
    assert on["back"] == {"_cos_cache": True, "_sin_cache": True, "_cos_sin_cache": True}, proc.stderr[-2000:]
    assert on["same_output"] is True
    # one storage: [512 positions, 2, rope_dim 4] float32; the MLA matrices are views of kv_b_proj (not kept)
    assert on["kept_lines"] and "plain tensors kept: 1 storage(s), 16384 bytes" in on["kept_lines"][0]
    disabled, _ = run(model_dir, ROPE, shim=True, device="npu", ascend="0.23.0",
                      SHIM_DISABLED_PATCHES="vllm-ascend-level2-tensors")
    assert disabled["back"]["_cos_cache"] is False and disabled["same_output"] is False


def test_npu_ascend_rope_caches_absent_before_0130(model_dir):
    """vllm-ascend 0.13.0rc1 records no ``_cos_cache`` / ``_sin_cache``: nothing to keep, nothing lost."""
    on, proc = run(model_dir, ROPE, shim=True, device="npu", ascend="0.13.0rc1")
    assert on is not None, proc.stderr[-2000:]
    assert on["recorded"] is False and on["same_output"] is True and on["kept_lines"] == []


def test_selection_of_module_globals(monkeypatch):
    """``shim.vllm.weights.buffers._globals_to_keep``: a ``vllm_ascend`` module global whose storage lies in the
    weights pool is kept once (two halves of one tensor: one copy); one outside the pool, one sharing a
    buffer's storage (vllm-ascend restores buffers itself), a global of another package and a storage
    the attribute walk already keeps are not."""
    import types

    import torch

    from shim.vllm.sleep import sleep_pool
    from shim.vllm.weights import buffers

    model = torch.nn.Module()
    model.rope = torch.nn.Module()
    model.rope.register_buffer("cos_sin_cache", torch.randn(8, 4))
    both = torch.randn(8, 2, 4)
    mod = types.ModuleType("vllm_ascend.ops.fake_rope")
    mod._cos_cache, mod._sin_cache = both[:, 0], both[:, 1]
    mod._cos_sin_cache = model.rope.cos_sin_cache
    mod._outside = torch.randn(4)
    mod._already = torch.randn(4)
    other = types.ModuleType("not_ascend.rope")
    other._cache = torch.randn(4)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, other.__name__, other)
    pooled = [both, model.rope.cos_sin_cache, mod._already, other._cache]
    monkeypatch.setattr(sleep_pool, "spans", lambda tag: [(t.untyped_storage().data_ptr(),
                                                          t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                                                         for t in pooled])
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))
    already = mod._already.untyped_storage().data_ptr()
    kept = [ptr for ptr, _ in buffers._globals_to_keep(worker, {already})]
    assert kept == [both.untyped_storage().data_ptr()]
