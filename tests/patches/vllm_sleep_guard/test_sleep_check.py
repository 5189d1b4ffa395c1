"""vLLM sleep guard (patches/vllm_sleep_guard.py): every sleep frees what it should.

Each scenario runs in a fresh interpreter on the vLLM stand-in (tests/fakevllm),
once with the shim off (the bug must show: asserted) and once with it on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.helpers import REPO, clean_env, last_json, run_python
from tests.support.vllm_scenario import FAKEVLLM, PRELUDE, VALUE, GiB, scenario  # noqa: F401

CHILDREN = Path(__file__).parent / "children"
ROUTE = CHILDREN / "route.py"  # each body runs after tests/support/children/vllm_scenario_prelude.py
BUILD_ENV = CHILDREN / "build_env.py"
CYCLE = CHILDREN / "cycle.py"
WAKE = CHILDREN / "wake.py"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)

# ---------------------------------------------------------------------------
# ms-swift #6636: level 1, expandable segments on through every route
# ---------------------------------------------------------------------------
ROUTES = {
    # id: (env, without-shim behaviour on the stand-in)
    "npu-PYTORCH_NPU_ALLOC_CONF": ({"FAKEVLLM_DEVICE": "npu", "PYTORCH_NPU_ALLOC_CONF": VALUE}, "assert"),
    "npu-PYTORCH_ALLOC_CONF": ({"FAKEVLLM_DEVICE": "npu", "PYTORCH_ALLOC_CONF": VALUE}, "zero"),
    "npu-live": ({"FAKEVLLM_DEVICE": "npu", "LIVE": "1"}, "zero"),
    "cuda-old-PYTORCH_CUDA_ALLOC_CONF": ({"FAKEVLLM_TORCH": "old", "PYTORCH_CUDA_ALLOC_CONF": VALUE}, "full"),
    "cuda-old-PYTORCH_ALLOC_CONF": ({"FAKEVLLM_TORCH": "old", "PYTORCH_ALLOC_CONF": VALUE}, "zero"),
    "cuda-old-PYTORCH_HIP_ALLOC_CONF": ({"FAKEVLLM_TORCH": "old", "FAKEVLLM_ROCM": "1",
                                         "PYTORCH_HIP_ALLOC_CONF": VALUE}, "zero"),
    "cuda-old-live": ({"FAKEVLLM_TORCH": "old", "LIVE": "1"}, "zero"),
    "cuda-modern-PYTORCH_ALLOC_CONF": ({"FAKEVLLM_TORCH": "modern", "PYTORCH_ALLOC_CONF": VALUE}, "full"),
}



@pytest.mark.parametrize("route", list(ROUTES))
def test_issue_6636_every_route(model_dir, route):
    env, without = ROUTES[route]
    off, _ = scenario(model_dir, ROUTE, shim=False, TEST_VALUE=VALUE, **env)
    on, proc = scenario(model_dir, ROUTE, shim=True, TEST_VALUE=VALUE, **env)
    user_env = {k: env.get(k) for k in on["env"]}

    # shim off: the stand-in's real behaviour for this route
    if without == "assert":  # vllm-ascend CaMemAllocator asserts on the env string
        assert "Expandable segments are not compatible" in off["error"]
    elif without == "zero":  # #6636: the pool is empty, the sleep frees ~0
        assert off["engine"] > 10 * GiB and off["tracked"] == 0
        assert off["freed"] < 0.01 * off["engine"] and off["freed2"] < 0.01 * off["engine"]
    else:  # vLLM 0.24's own toggle (PYTORCH_CUDA_ALLOC_CONF) / modern torch: no bypass
        assert off["freed"] >= 0.9 * off["tracked"] > 10 * GiB

    # shim on: >= 90% of the tracked bytes come back, every sleep
    assert "error" not in on, on
    assert on["tracked"] >= 0.9 * on["engine"] > 10 * GiB
    assert on["freed"] >= 0.9 * on["tracked"] and on["freed2"] >= 0.9 * on["tracked"]
    assert on["tokens"] == 3
    # the user's setting is back: env strings exact (other keys intact), live setting on
    assert on["env"] == user_env
    assert on["live"] is True
    assert "INEFFECTIVE" not in proc.stderr and "WARNING" not in proc.stderr
    # the construction line names the route the user turned expandable segments on with (the guard saw it)
    route_var = next((k for k in env if k in on["env"]), "live setting")
    assert f"(expandable segments on via {route_var}" in proc.stderr, proc.stderr[-2000:]
    assert "off during construction (shim guard)" in proc.stderr
    # the first sleep at INFO, the second DEBUG unless it is the first checked from the pool's bookkeeping
    # (tests/unit/test_log_volume.py); the summary counts each once
    assert proc.stderr.count("] INFO sleep LLMEngine#1 level=1: freed") == 1 + proc.stderr.count("pool's bookkeeping")
    assert "sleep summary rank 0: 2 sleeps, 0 ineffective" in proc.stderr




@pytest.mark.parametrize("route", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                                   "PYTORCH_NPU_ALLOC_CONF"])
def test_every_env_route_off_inside_the_build(model_dir, route):
    """Processes started during the build (vLLM's multiprocessing workers, compile workers)
    inherit the ENV, not this process's live allocator setting: each route must read
    expandable segments off inside the build, whatever the live setting says."""
    off, _ = scenario(model_dir, BUILD_ENV, shim=False, **{route: VALUE})
    on, _ = scenario(model_dir, BUILD_ENV, shim=True, **{route: VALUE})
    others = {k: None for k in on["inside"] if k != route}
    assert off["inside"] == off["child"] == {**others, route: VALUE}  # without the shim: on inside the build
    off_value = "max_split_size_mb:128,expandable_segments:False"
    assert on["inside"] == on["child"] == {**others, route: off_value}  # the other keys kept
    assert on["live_inside"] is False
    assert on["after"] == {**others, route: VALUE}  # the user's exact string back


# ---------------------------------------------------------------------------
# ineffective sleeps: detected, explained, re-checked after warm-up
# ---------------------------------------------------------------------------


def test_ineffective_sleep_without_sleep_mode(model_dir):
    kw = json.dumps({"enable_sleep_mode": False})
    off, poff = scenario(model_dir, CYCLE, shim=False, FAKEVLLM_DEVICE="npu", TEST_KW=kw)
    on, pon = scenario(model_dir, CYCLE, shim=True, FAKEVLLM_DEVICE="npu", TEST_KW=kw)
    assert off["freed"] == 0 and "ineffective" not in poff.stderr  # nobody notices
    assert on["freed"] == 0
    warnings = [line for line in pon.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2 and all("ineffective sleep LLMEngine#1" in w for w in warnings)
    assert "engine built without enable_sleep_mode" in warnings[0] and "enable_sleep_mode=True" in warnings[0]
    assert "re-checks" not in warnings[0]  # no pool to reset: nothing to re-check
    assert "sleep summary rank 0: 2 sleeps, 2 ineffective" in pon.stderr


@pytest.mark.parametrize("strict", [False, True])
def test_guard_disabled_detected_and_reset_after_warmup(model_dir, strict, tmp_path):
    trace = tmp_path / "trace.jsonl"
    env = dict(FAKEVLLM_DEVICE="npu", PYTORCH_ALLOC_CONF=VALUE, TEST_THEN="again")  # then a wake, a generate, a sleep
    if not strict:
        off, poff = scenario(model_dir, CYCLE, shim=False, **env)
        assert off["freed"] == 0 and off["freed2"] == 0 and "ineffective" not in poff.stderr
    env.update(SHIM_DISABLED_PATCHES="vllm-sleep-guard,vllm-worker-sleep-guard", SHIM_TRACE=str(trace))
    if strict:
        env["SHIM_STRICT"] = "1"
    on, pon = scenario(model_dir, CYCLE, shim=True, check=not strict, **env)
    warnings = [line for line in pon.stderr.splitlines() if "WARNING" in line]
    first = warnings[0]
    assert "ineffective sleep LLMEngine#1 level=1: the device got back 0.00 GiB" in first
    assert "expandable segments were on when the engine allocated its memory (PYTORCH_ALLOC_CONF)" in first
    assert "re-checks at the sleep after the warm-up" in first
    assert "first-sleep reset LLMEngine#1: the sleep after the warm-up, re-issued, is still ineffective" in warnings[1]
    assert "cannot be released at run time" in warnings[1]
    assert "40.00 GiB of this engine's memory was allocated outside the sleep pool" in warnings[1]
    assert len(warnings) == 2
    # the reset re-issued the sleep once (wake every tag, give cached blocks back, sleep, measure)
    sleeps = [r for r in map(json.loads, trace.read_text().splitlines()) if r["event"] == "sleep"]
    notes = [r["note"] for r in sleeps]
    assert notes.count("first-sleep reset: re-issued") == 1 and notes.index("first-sleep reset: re-issued") == 2
    if strict:
        assert pon.returncode != 0 and "RuntimeError: [shim] first-sleep reset" in pon.stderr
    else:
        assert on["tokens"] == 3 and on["freed2"] == 0
        assert on["asleep"] is True and len(sleeps) == 4  # the engine is asleep as the trainer left it
        assert on["tokens2"] == off["tokens2"]  # level 1 after the re-issue: the same weights, the same tokens


def test_reset_reissue_failure_never_stops_training(model_dir):
    """The re-issued sleep is the shim's own extra action: if it raises, one WARNING and training goes on."""
    env = dict(FAKEVLLM_DEVICE="npu", PYTORCH_ALLOC_CONF=VALUE,
               SHIM_DISABLED_PATCHES="vllm-sleep-guard,vllm-worker-sleep-guard",
               TEST_THEN="boom")  # the engine's wake_up raises from the second sleep on (the re-issue's wake)
    on, pon = scenario(model_dir, CYCLE, shim=True, **env)
    assert on["after"] == "went on"
    assert ("first-sleep reset LLMEngine#1: re-issuing the sleep failed (RuntimeError: wake_up broke)"
            in pon.stderr), pon.stderr[-2000:]


def test_reset_recovered_branch():
    """The re-check logs a recovered engine (in-process unit: no stand-in case recovers at run time)."""
    proc = run_python((CHILDREN / "reset_recovered.py").read_text())
    assert proc.stdout.strip() == "recovered"
    assert "first-sleep reset LLMEngine#1: after the warm-up the sleep freed 40.00 GiB" in proc.stderr
    assert "first-sleep reset LLMEngine#2: after the warm-up the re-issued sleep freed 40.00 GiB" in proc.stderr


# ---------------------------------------------------------------------------
# per-tag wake, cached blocks released before waking, no double counting
# ---------------------------------------------------------------------------


def test_per_tag_wake(model_dir):
    off, _ = scenario(model_dir, WAKE, shim=False)
    on, proc = scenario(model_dir, WAKE, shim=True, SHIM_DEBUG="1")  # every sleep/wake line
    assert off["asleep"] == ["kv_cache"] and "illegal memory access" in off["gen_error"]
    assert "out of memory" in off["wake_error"]  # blocks cached by PyTorch not given back
    assert off["weights_mapped"] is True  # the partial-wake sleep was ignored: weights stay on device
    assert on["asleep"] == [] and on["tokens"] == 3 and on["tokens2"] == 3 and "wake_error" not in on
    assert on["asleep_end"] == ["kv_cache", "weights"] and on["weights_mapped"] is False
    sleeps = [line for line in proc.stderr.splitlines() if "] INFO sleep LLMEngine#1" in line
              or "] DEBUG sleep LLMEngine#1" in line]
    assert len(sleeps) == 3, proc.stderr  # LLM.sleep + LLMEngine.sleep counted once each call
    assert "woke it first" in sleeps[2]
    assert "asked weights,kv_cache: the others were awake" in proc.stderr


# ---------------------------------------------------------------------------
# telemetry: trace, report, plot
# ---------------------------------------------------------------------------
def _shim_cli(*args, check=False, path=()):
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(REPO)])
    return subprocess.run([sys.executable, "-m", "shim", *args], capture_output=True, text=True, env=env,
                          cwd=str(REPO))


def test_trace_and_report(model_dir, tmp_path):
    trace = tmp_path / "trace.jsonl"
    _, proc = scenario(model_dir, CYCLE, shim=True, SHIM_TRACE=str(trace), RANK="0", LOCAL_RANK="0")
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    activations = [r for r in records if r["event"] == "activate"]
    assert len(activations) == 1 and activations[0]["rank"] == 0  # this process turned the shim on
    records = [r for r in records if r["event"] != "activate"]
    assert [r["event"] for r in records] == ["init", "sleep", "wake", "sleep"]
    for r in records:
        assert r["rank"] == 0 and r["engine"] == "LLMEngine#1" and r["pid"]
    # the first sleep and its wake are read on the device; the second sleep (same level, pool as at the
    # last reading) is verified from the pool's bookkeeping (shim.vllm.sleep.sleep_verdict), without device figures
    assert [r.get("measured") for r in records] == [None, "device", "device", "pool"]
    assert all(r["free"] <= r["total"] for r in records[:3]) and records[3]["free"] is None
    assert records[3]["freed"] == records[3]["tracked"] == records[1]["tracked"]
    s = records[1]
    assert s["level"] == 1 and s["effective"] is True and s["freed"] >= 0.9 * s["tracked"] > 10 * GiB
    assert records[2]["tags"] == ["kv_cache", "weights"] and records[2]["restored"] > 10 * GiB
    # the shim's own seconds around each sleep/wake call (bench/gpu_sleep_memory.py reports their ratio)
    assert all(0 <= r["shim_s"] < 5 for r in records[1:])
    # a second rank (same records, rank 1, one ineffective sleep)
    other = tmp_path / "rank1.jsonl"
    rank1 = [dict(r, rank=1, pid=r["pid"] + 1) for r in records]
    rank1[3].update(effective=False, freed=0)
    other.write_text("".join(json.dumps(r) + "\n" for r in rank1))
    rep = _shim_cli("report", str(trace), str(other))
    assert rep.returncode == 0, rep.stderr
    lines = rep.stdout.splitlines()
    assert lines[0].split()[:7] == ["run", "start", "rank", "pid", "engines", "cycles", "sleeps"]
    row0, row1 = ([r[2]] + r[4:] for r in (lines[1].split(), lines[2].split()))  # rank, engines, ... (no pid)
    assert lines[1].split()[0] == lines[2].split()[0] == "1"  # the two ranks of one run
    assert row0[:4] == ["0", "1", "1", "2"] and row0[6] == "0"
    assert row1[:4] == ["1", "1", "1", "2"] and row1[6] == "1" and row1[5] == "0.00"
    assert float(row0[4]) > 10
    assert lines[0].split()[-2:] == ["shim", "ms/call"] and 0 <= float(row0[-1]) < 5000  # median shim_s
    # --plot: a PNG with matplotlib (in tests/requirements.txt), one clear line and exit 1 without it
    png = tmp_path / "mem.png"
    plot = _shim_cli("report", str(trace), "--plot", str(png))
    assert plot.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot.stderr
    no_mpl = tmp_path / "no_mpl"
    no_mpl.mkdir()
    (no_mpl / "matplotlib.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    plot = _shim_cli("report", str(trace), "--plot", str(tmp_path / "none.png"), path=[no_mpl])
    assert plot.returncode == 1 and plot.stderr.strip().splitlines() == [
        "shim: report: --plot needs matplotlib (pip install matplotlib); the table above is complete"]


def test_report_bad_input(tmp_path):
    missing = _shim_cli("report", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert "cannot read" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "sleep", "t": 1, "engine": "E#1"}\n{not json\n')
    proc = _shim_cli("report", str(bad))  # a bad line is skipped and counted (tests/unit/test_report.py)
    assert proc.returncode == 0 and proc.stderr.strip() == (
        f"shim: report: skipped 1 line(s) that are not whole trace records ({bad}:2: not a JSON line "
        f"(Expecting property name enclosed in double quotes))")
    assert _shim_cli("report").returncode == 2


def test_trace_lines_whole_with_many_writers(tmp_path):
    from shim.observe import events

    path = str(tmp_path / "t.jsonl")
    payload = "x" * 3000

    def writer(rank):
        for i in range(100):
            events.write_trace(path, {"rank": rank, "i": i, "pad": payload})

    threads = [threading.Thread(target=writer, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = open(path).read().splitlines()
    assert len(lines) == 800 and all(json.loads(line)["pad"] == payload for line in lines)


# ---------------------------------------------------------------------------
# the allocator guard itself (no vLLM)
# ---------------------------------------------------------------------------
def test_alloc_guard_restores_exactly():
    out = last_json(run_python((CHILDREN / "alloc_guard.py").read_text(), env=clean_env()))
    assert out["after"] == out["before"]
    assert out["inside"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:False"
    assert out["inside"]["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:False,garbage_collection_threshold:0.6"
    assert out["inside"]["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"
    assert out["nested"] == ["expandable_segments:False"]
    # first guard: off then back on; after the user turned it off live, the guard leaves it alone
    assert out["calls"] == ["expandable_segments:False", "expandable_segments:True", "expandable_segments:False"]


def test_import_shim_auto_imports_no_torch_or_vllm():
    proc = run_python("import json, sys, shim.auto, shim.engine.catalog; shim.engine.catalog.all_patches()\n"
                      "print(json.dumps([m for m in ('torch', 'vllm', 'trl', 'vllm_ascend') if m in sys.modules]))",
                      path=[FAKEVLLM], fresh=True)
    assert last_json(proc) == []
