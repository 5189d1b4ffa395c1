"""After a weight push: stale encoder embeddings (huggingface/trl#7198) and a prefix-cache reset
that fails silently (vllm-project/vllm#28827). Patches ``trl-vlm-encoder-cache`` and
``vllm-prefix-reset-check`` (``shim.vllm.weights.caches``).

The TRL cases drive the REAL ``VLLMGeneration`` of the TRL release (tests/scenarios/trl_vlm_run.py)
on the vLLM stand-in, whose encoder cache shares an image's output across requests by content
hash (vLLM's ``EncoderCacheManager``) and whose ``reset_prefix_cache`` fails while a request
holds KV blocks (vLLM's ``BlockPool.reset_prefix_cache``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env, last_json, rendezvous_port, run_python
from tests.support.stand_in import run
from tests.support.trl_support import fake_site

SCENARIO = REPO / "tests" / "scenarios" / "trl_vlm_run.py"
CHILDREN = Path(__file__).parent / "children"  # stand_in bodies
ALWAYS_FALSE = CHILDREN / "reset_always_false.py"
FALSE_ONCE = CHILDREN / "reset_false_once.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def vlm_run(trl_version, model_dir, *args, vllm="0.24.0", **env):
    environment = clean_env(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                            OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="ERROR", MASTER_PORT=rendezvous_port(),
                            **env)
    for k in [k for k in environment if k.startswith("FAKEVLLM_")]:
        del environment[k]
    environment["FAKEVLLM_VERSION"] = vllm
    code = (f"import runpy, sys; sys.argv = ['trl_vlm_run', '--model', {str(model_dir)!r}] + {list(args)!r}; "
            f"runpy.run_path({str(SCENARIO)!r}, run_name='__main__')")
    proc = run_python(code, path=[trl_path(trl_version), fake_site(vllm)], env=environment, timeout=600)
    return last_json(proc), proc


@pytest.mark.parametrize("version", ["1.16.0", "1.9.2"])
def test_trl_push_with_image_reused_and_request_in_flight(version, model_dir):
    off, _ = vlm_run(version, model_dir, "--inflight")
    assert off["trained_weights"] is True
    assert off["stale_encoder_hits"] == 1  # trl#7198: the image's embedding of the old weights
    assert off["prefix_resets"] == [False] and off["stale_prefix_hits"] == 1  # vllm#28827, ignored by TRL
    on, proc = vlm_run(version, model_dir, "--inflight", "--shim", "on")
    assert on["stale_encoder_hits"] == 0 and on["encoder_resets"] >= 1, proc.stderr
    assert on["prefix_resets"][0] is False and on["prefix_resets"][-1] is True and on["stale_prefix_hits"] == 0
    assert "retried with the running requests preempted" in proc.stderr


def test_each_patch_disabled_alone(model_dir):
    no_encoder, _ = vlm_run("1.16.0", model_dir, "--inflight", "--shim", "on",
                            SHIM_DISABLED_PATCHES="trl-vlm-encoder-cache")
    assert no_encoder["stale_encoder_hits"] == 1 and no_encoder["stale_prefix_hits"] == 0
    no_prefix, _ = vlm_run("1.16.0", model_dir, "--inflight", "--shim", "on",
                           SHIM_DISABLED_PATCHES="vllm-prefix-reset-check")
    assert no_prefix["stale_prefix_hits"] == 1 and no_prefix["stale_encoder_hits"] == 0


def test_sleep_mode_resets_the_caches_itself_from_vllm_0_17(model_dir):
    """vLLM 0.17+ ``EngineCore.sleep`` resets the prefix, mm and encoder caches: with sleep mode on,
    TRL 1.16's push follows a sleep and nothing is stale even without the shim."""
    off, _ = vlm_run("1.16.0", model_dir, "--sleep", "on")
    assert off["stale_encoder_hits"] == 0 and off["trained_weights"] is True


def test_reset_that_keeps_failing_warns_once_strict_raises(model_dir):
    off, proc = run(model_dir, ALWAYS_FALSE, shim=False)
    assert off["results"] == [False] * 3 and "vllm#28827" not in proc.stderr  # silent
    on, proc = run(model_dir, ALWAYS_FALSE, shim=True)
    assert on["results"] == [False] * 3
    assert proc.stderr.count("reset_prefix_cache() returned False after a weight update") == 1, proc.stderr
    assert "retried with the engine idle: still False" in proc.stderr
    strict, proc = run(model_dir, ALWAYS_FALSE, shim=True, SHIM_STRICT="1")
    assert "vllm#28827" in strict["raised"] and strict["results"] == []


def test_reset_false_once_with_nothing_in_flight_is_retried_at_once(model_dir):
    """No request unfinished: the retry is a plain second reset (nothing to preempt), and it holds."""
    off, _ = run(model_dir, FALSE_ONCE, shim=False)
    assert off["unfinished"] is False and off["result"] is False and off["calls"] == [False]  # the bug: ignored
    on, proc = run(model_dir, FALSE_ONCE, shim=True)
    assert on["result"] is True and on["calls"] == [False, False], proc.stderr
    assert "[shim] INFO reset_prefix_cache() returned False (KV blocks in use); retried with the engine idle: " \
           "reset" in proc.stderr
    assert "WARNING" not in proc.stderr


def test_reset_that_keeps_failing_is_a_warning(model_dir):
    """The report of a reset that stays False is WARNING-level (the level, not only the text)."""
    on, proc = run(model_dir, ALWAYS_FALSE, shim=True)
    lines = [line for line in proc.stderr.splitlines() if "returned False after a weight update" in line]
    assert len(lines) == 1 and lines[0].startswith("[shim] WARNING "), proc.stderr


def test_online_dpo_push_with_sleep_on_resets_the_encoder_cache(model_dir):
    """Sleep on, where the sleep does not reset the caches (vLLM 0.16: ``reset_encoder_cache`` exists, the
    reset inside ``EngineCore.sleep`` comes in 0.17; TRL 1.0.0 supports vLLM 0.10.2-0.17.1): OnlineDPO's
    own push (``_move_model_to_vllm``, prefix reset only) runs through the shim's push path
    (``shim.trl.colocate`` -> ``synced_llm.after_push``), the only place that resets the encoder cache
    for it (``VLLMGeneration.sync_weights`` is not involved)."""
    off, _ = vlm_run("1.0.0", model_dir, "--trainer", "online_dpo", "--sleep", "on", vllm="0.16.0")
    assert off["trained_weights"] is True and off["stale_encoder_hits"] == 1  # trl#7198 in OnlineDPO
    on, proc = vlm_run("1.0.0", model_dir, "--trainer", "online_dpo", "--sleep", "on", "--shim", "on",
                       vllm="0.16.0")
    assert on["trained_weights"] is True and on["stale_encoder_hits"] == 0 and on["encoder_resets"] >= 1, \
        proc.stderr


def test_online_dpo_push_with_sleep_off_resets_the_encoder_cache(model_dir):
    """Sleep mode off (OnlineDPO's default): no sleep resets the caches and the shim's push path is not
    involved; OnlineDPO's own push (``_move_model_to_vllm``, prefix reset only) is followed by the encoder
    reset of ``trl-online-dpo-encoder-cache`` alone (the VLLMGeneration record disabled: it must not be
    what resets here)."""
    off, _ = vlm_run("1.16.0", model_dir, "--trainer", "online_dpo", "--sleep", "off")
    assert off["trained_weights"] is True and off["stale_encoder_hits"] == 1  # trl#7198 in OnlineDPO, newest TRL
    on, proc = vlm_run("1.16.0", model_dir, "--trainer", "online_dpo", "--sleep", "off", "--shim", "on",
                       SHIM_DISABLED_PATCHES="trl-vlm-encoder-cache")
    assert on["trained_weights"] is True and on["stale_encoder_hits"] == 0 and on["encoder_resets"] >= 1, \
        proc.stderr


def test_grpo_push_path_alone_resets_the_encoder_cache(tmp_path):
    """TRL 0.27.2 GRPO (colocate, sleep on, level 2) whose every prompt carries the same image, on vLLM 0.16
    (``reset_encoder_cache`` exists, the sleep does not reset the caches yet): no ``VLLMGeneration`` and no
    OnlineDPO push are involved, so the only reset after a push is the shim's own push path
    (``shim.trl.colocate`` -> ``synced_llm.after_push`` -> ``caches.after_push``). Without the shim, images
    reused after a push get the encoder output of the old weights (trl#7198 in GRPO's own push)."""
    from tests.support.trl_support import run_trl

    args = ("--trainer", "grpo", "--images", "--steps", "3")
    off = run_trl("0.27.2", tmp_path / "off", *args, "--shim", "off", vllm="0.16.0")
    assert off["encoder_hits"] > 0 and off["stale_encoder_hits"] > 0 and off["encoder_resets"] == 0  # the bug
    on = run_trl("0.27.2", tmp_path / "on", *args, "--shim", "before", vllm="0.16.0")
    assert not [d for d in on["decisions"] if "online-dpo" in d and on["decisions"][d] == "applied"]
    assert on["mismatches"] == 0 and len(on["generates"]) == len(off["generates"]) > 2
    assert on["encoder_hits"] > 0 and on["stale_encoder_hits"] == 0 and on["encoder_resets"] >= 2, on["shim_warnings"]
