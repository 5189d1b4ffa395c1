"""The re-processing fallback of ``shim.vllm.reload.session`` and the attention layers' signature.

Where vLLM's layerwise reload cannot be used (none before 0.16; ``initialize_layerwise_reload`` failing), the
session re-runs ``process_weights_after_loading`` of each attention layer the push wrote. That method takes
the activation dtype up to vLLM 0.33 (``Attention`` / ``MLAAttention``: ``(self, act_dtype)``, 0.33.0
``attention.py:594`` / ``mla_attention.py:1242``) and nothing from 0.34 (``(self)``, 0.34.0 ``attention.py:620``
/ ``mla_attention.py:1428``): the fallback calls it with the signature the installed class has. The push here
writes new ``kv_b_proj`` weights into a DeepSeek-V2 whose ``kv_b_proj`` is quantized (the derived matrices are
copies, stale until re-derived).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stand_in import run

BODY = Path(__file__).parent / "children" / "fallback_push.py"  # a stand_in body
ENV = {"FAKEVLLM_QUANTIZATION": "fp8"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_mla_model

    return make_tiny_mla_model(str(tmp_path_factory.mktemp("mla") / "m"), seed=0)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_fallback_reprocesses_with_the_installed_signature(model_dir, version):
    on, proc = run(model_dir, BODY, shim=True, version=version, TEST_FALLBACK="1", **ENV)
    assert on["error"] is None, on["error"]
    assert on["pushed"] is True and on["derived"] is True, proc.stderr


def test_layerwise_path_on_034(model_dir):
    """The ordinary path on 0.34: vLLM's reload finalize runs the hook itself (the stand-in's loaders call it
    without a dtype there)."""
    on, proc = run(model_dir, BODY, shim=True, version="0.34.0", **ENV)
    assert on["error"] is None and on["pushed"] is True and on["derived"] is True, proc.stderr


def test_raw_push_leaves_the_matrices_stale(model_dir):
    """The failing half: the same push without the session (the shim off) leaves them stale."""
    off, _ = run(model_dir, BODY.read_text().replace("with reload.session(llm):", "if True:"), shim=False,
                 version="0.34.0", **ENV)
    assert off["pushed"] is True and off["derived"] is False


def test_push_on_034_runs_vllms_reload_lifecycle_with_the_cap_lifted(model_dir):
    """vLLM 0.34: the session opens the push with ``start_reload`` (``weight_update_active()`` true while
    ``load_weights`` runs, as some models' loaders read it) and lifts the torch cap of the extensible KV cache
    for it, as vLLM's own ``Worker.reload_weights`` (``kv_cache_lent_for_weight_update``); the cap is back
    after. Without the session (the shim off) the push runs capped and outside any update."""
    on, proc = run(model_dir, BODY, shim=True, version="0.34.0", **ENV)
    assert on["error"] is None and on["derived"] is True, proc.stderr
    assert on["fraction_before"] < 1.0 and on["fraction_after"] == on["fraction_before"]
    assert on["during"] and all(d == [1.0, True] for d in on["during"]), on["during"]
    off, _ = run(model_dir, BODY.read_text().replace("with reload.session(llm):", "if True:"), shim=False,
                 version="0.34.0", **ENV)
    assert all(d == [off["fraction_before"], False] for d in off["during"]), off["during"]


KV_BODY = Path(__file__).parent / "children" / "kv_scale_push.py"  # a stand_in body


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("dense") / "m"), seed=0)


@pytest.mark.parametrize("fallback", ["1", "0"], ids=["fallback", "layerwise"])
def test_push_rederives_plain_attention_kv_scales(dense_dir, fallback):
    """A plain ``Attention`` derives from its own parameters too: vLLM 0.34 keeps an fp8 model's KV-cache scale
    parameters (``k_scale`` ...) after the load, and its KV-cache quant method derives from them what the kernels
    read (``_k_scale``, ``_k_scale_float``, ``_k_scale_cpu``, ...; ``quantization/kv_cache.py``). A push of new
    scales is followed: on the fallback, the session re-processes the plain attention layers it wrote (their
    quant method first, as vLLM's ``_reload_attention_scales``); through vLLM's own reload, its finalize does.
    Without the session (the shim off) the derived scales stay the checkpoint's."""
    on, proc = run(dense_dir, KV_BODY, shim=True, version="0.34.0", TEST_FALLBACK=fallback, **ENV)
    assert on["layers"] == 2 and on["before"] == [1.0, 1.0], on
    assert on["pushed"] is True and on["derived"] is True, proc.stderr[-3000:]
    assert on["tokens"] == 4
    off, _ = run(dense_dir, KV_BODY.read_text().replace("with reload.session(llm):", "if True:"), shim=False,
                 version="0.34.0", TEST_FALLBACK=fallback, **ENV)
    assert off["pushed"] is True and off["derived"] is False
