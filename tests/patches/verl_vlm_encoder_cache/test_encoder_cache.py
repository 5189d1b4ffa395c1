"""``verl-vlm-encoder-cache`` on the real verl releases: verl's own ``vLLMHttpServer`` (``generate`` with an image,
``sleep``, the wakes, ``clear_kv_cache`` after the push) on the stand-in's ``AsyncLLM`` (engine core in its own
process), whose encoder cache keeps an image's output by content hash across requests (vLLM's
``EncoderCacheManager``) and whose sleep resets it from vLLM 0.17 (``EngineCore._reset_caches``).
``tests/support/verl_support.py`` ``CACHE_SCENARIO``: two rollouts over the same image around one weight push,
shim off, then on. ``stale_encoder_hits``: the second rollout read the image's embedding of the old weights."""
from tests.support.verl_support import run_caches

FIXED = {"stale_encoder_hits": 0, "encoder_hits": 0, "push_resets": ["reset_mm_cache", "reset_encoder_cache"]}
"""What verl 0.9.0 itself does after the push (``test_verl_0_9_0_stands_down_and_resets_both_itself``)."""
STALE = {"stale_encoder_hits": 1, "encoder_hits": 1, "push_resets": []}


def looks(phase: dict) -> dict:
    return {k: phase[k] for k in FIXED}


def test_verl_0_7_1_every_flow(tmp_path):
    """0.7.1: stale after the push with verl's sleep too (its HYBRID ``sleep`` is ``collective_rpc("sleep")``,
    past ``EngineCore.sleep``, so even vLLM 0.24 keeps the cache) and without it; the shim resets both caches."""
    r, err = run_caches("0.7.1", "0.24.0", ["sleep", "awake"], tmp_path)
    assert looks(r["off"]["sleep"]) == STALE and looks(r["off"]["awake"]) == STALE, r  # verl#6523
    assert r["off"]["sleep"]["encoder_resets"] == [], r
    assert r["decision"] == "applied" and r["probe"] is None, r
    assert looks(r["on"]["sleep"]) == FIXED and looks(r["on"]["awake"]) == FIXED, r
    assert "verl-vlm-encoder-cache: after verl's weight update" in err


def test_verl_0_8_0_push_without_verls_sleep_and_the_double_reset(tmp_path):
    """0.8.0, vLLM 0.24. ``free_cache_engine=False`` (no sleep before the push): stale; the shim fixes it.
    Sleep on: 0.8.0's ``_sleep_hybrid`` (``engine.sleep`` then ``reset_encoder_cache``) already cleared it, not
    stale; the shim's reset after the push comes on top (three resets, the cache already empty), exactly the
    resets verl 0.9.0 makes in that flow."""
    r, _ = run_caches("0.8.0", "0.24.0", ["awake", "sleep"], tmp_path)
    assert looks(r["off"]["awake"]) == STALE, r
    assert r["off"]["sleep"]["stale_encoder_hits"] == 0 and r["off"]["sleep"]["encoder_resets"] == ["sleep", "api"], r
    assert r["decision"] == "applied", r
    assert looks(r["on"]["awake"]) == FIXED, r
    assert looks(r["on"]["sleep"]) == FIXED and r["on"]["sleep"]["encoder_resets"] == ["sleep", "api", "api"], r


def test_verl_0_8_0_sleep_on_with_vllm_0_16(tmp_path):
    """0.8.0's own reset waits for vLLM 0.17 (and 0.16's sleep resets no encoder cache): the default sleep-on
    flow is stale there; the shim's reset after the push (``AsyncLLM.reset_encoder_cache`` exists from 0.16)
    fixes it."""
    r, _ = run_caches("0.8.0", "0.16.0", ["sleep"], tmp_path)
    assert looks(r["off"]["sleep"]) == STALE and r["off"]["sleep"]["encoder_resets"] == [], r
    assert looks(r["on"]["sleep"]) == FIXED, r


def test_verl_0_8_0_with_vllm_0_12_has_no_encoder_reset_one_warning(tmp_path):
    """vLLM 0.12 (verl 0.8.0's ``vllm`` extra pins <=0.12.0) has no ``reset_encoder_cache``: the shim resets the
    mm cache and says, once, that the encoder cache cannot be (the image stays stale: nothing public drops it)."""
    r, err = run_caches("0.8.0", "0.12.0", ["awake"], tmp_path)
    assert looks(r["off"]["awake"]) == STALE, r
    assert r["on"]["awake"]["push_resets"] == ["reset_mm_cache"] and r["on"]["awake"]["stale_encoder_hits"] == 1, r
    warning = "this vLLM has no reset_encoder_cache (added in 0.16.0)"
    assert err.count(warning) == 1 and "volcengine/verl#6523" in err, err


def test_verl_0_9_0_stands_down_and_resets_both_itself(tmp_path):
    """0.9.0 (PR #6522): out of range, and the probe alone would stand down too (its ``clear_kv_cache`` resets the
    encoder cache); upstream's own ``clear_kv_cache`` resets the mm and encoder caches, in both flows."""
    r, _ = run_caches("0.9.0", "0.24.0", ["awake", "sleep"], tmp_path)
    assert r["decision"] == "stand down: fixed upstream in 0.9.0", r  # the range, before any probe
    assert r["probe"] == "fixed upstream (clear_kv_cache resets the encoder cache)", r
    for phase in ("off", "on"):
        assert looks(r[phase]["awake"]) == FIXED and looks(r[phase]["sleep"]) == FIXED, r
        assert r[phase]["sleep"]["encoder_resets"] == ["sleep", "api", "api"], r
