"""A level-2 sleep discards the MTP drafter's weights, and a push of the policy does not write them
(patches/vllm_level2_drafter.py, vllm#52479).

On the stand-in imitating vLLM 0.33 / 0.34, an engine with ``enable_sleep_mode`` and an MTP speculative config
(the drafter's own weights in the weights pool, as upstream) sleeps at level 2, wakes its weights, gets the
target's parameters pushed (raw ``load_weights``, the drafter never named: ms-swift 4.6.0's push), then wakes
its KV cache. Without the shim the drafter's weights are undefined after the wake (``weights_origin``
"garbage"): the target still decides every token (same output), but no draft would be accepted; 0.34 warns once.
With the shim ``sleep_preserve_parameter_names`` is ``["draft.*"]``, and vLLM keeps them (0.33: host copies
restored at the weights wake; 0.34: their allocation offloaded). Through ``vllm.LLM`` (``EngineArgs``) and
``AsyncLLM.from_engine_args(AsyncEngineArgs(...))`` (engine core in a forked process).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stand_in import run

BODY = Path(__file__).parent / "children" / "drafter_sleep.py"  # a stand_in body
LINE = "sleep_preserve_parameter_names=['draft.*']"
VERSIONS = ["0.33.0", "0.34.0"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("dense") / "m"), seed=0)


def go(model_dir, shim, version, engine="llm", **env):
    r, proc = run(model_dir, BODY, shim=shim, version=version, TEST_ENGINE=engine,
                  VLLM_WORKER_MULTIPROC_METHOD="fork", **env)
    assert r is not None, proc.stderr[-3000:]
    return r, proc


@pytest.mark.parametrize("engine", ["llm", "async"])
@pytest.mark.parametrize("version", VERSIONS)
def test_drafter_kept_across_level2(model_dir, version, engine):
    off, _ = go(model_dir, False, version, engine)
    assert off["preserve"] == [] and off["drafter_kept"] is False and off["drafter_origin"] == "garbage"  # the bug
    assert off["warned"] is (version == "0.34.0")  # 0.34 warns; 0.33 says nothing
    if engine == "llm":
        assert off["same_output"] is True  # the target verifies every draft token: slower, not wrong
    on, proc = go(model_dir, True, version, engine)
    assert on["decision"] == "applied", proc.stderr
    assert on["preserve"] == ["draft.*"], proc.stderr
    assert on["drafter_kept"] is True and on["warned"] is False  # the fingerprint (0.33's restore leaves the
    # stand-in's origin label as the wake set it)
    assert proc.stderr.count(LINE) == 1, proc.stderr
    if engine == "llm":
        assert on["same_output"] is True


def test_disabled_by_env(model_dir):
    r, proc = go(model_dir, True, "0.34.0", SHIM_DISABLED_PATCHES="vllm-level2-drafter")
    assert r["preserve"] == [] and r["drafter_kept"] is False and LINE not in proc.stderr


@pytest.mark.parametrize("engine", ["llm", "async"])
@pytest.mark.parametrize("preserve,expected", [("[]", []), ("draft.enorm", ["draft.enorm"])])
def test_callers_value_left_alone(model_dir, engine, preserve, expected):
    """An explicit value, ``[]`` included (a trainer that pushes its drafter and wants no host copy), stays."""
    r, proc = go(model_dir, True, "0.34.0", engine, TEST_PRESERVE=preserve)
    assert r["decision"] == "applied" and r["preserve"] == expected, proc.stderr
    assert LINE not in proc.stderr
    if preserve == "[]":
        assert r["drafter_kept"] is False  # the caller's choice


def test_no_speculative_config(model_dir):
    r, proc = go(model_dir, True, "0.34.0", TEST_SPEC="0")
    assert r["preserve"] == [] and LINE not in proc.stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pushed_drafter_is_the_pushed_one(model_dir, version):
    """A trainer that does push its drafter after the weights wake: the kept copy came back at that wake, the
    push writes over it."""
    r, proc = go(model_dir, True, version, TEST_PUSH_DRAFTER="1")
    assert r["preserve"] == ["draft.*"] and r["drafter_is_pushed"] is True, proc.stderr
    assert r["drafter_origin"] == "load_weights" and r["drafter_kept"] is False


def test_stands_down_below_033(model_dir):
    """0.31: no knob (an unknown keyword there); the record stays out of range, the engine builds as before."""
    r, proc = go(model_dir, True, "0.31.0")
    assert r["decision"].startswith("stand down"), proc.stderr
    assert r["drafter_kept"] is False and LINE not in proc.stderr
