"""Log volume over a long run (issue 12, part 4): 60 sleep/wake cycles of a stand-in engine.

At INFO: the patch decisions, the engine's construction, its first sleep and first wake, the first
sleep checked from the pool's bookkeeping instead of the device, every problem, one summary every SHIM_SUMMARY_EVERY sleeps (default 50) and one at exit; every other
sleep/wake line is DEBUG. SHIM_DEBUG=1 shows them all. Before this, every sleep and wake was an
INFO line (125 INFO lines over this run with main at b8c5ece).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from shim.engine import config, log
from shim.observe import events
from tests.support.helpers import REPO, clean_env, run_python

FAKEVLLM = REPO / "tests" / "fakevllm"
CYCLES = 60

BODY = Path(__file__).parent / "children" / "log_volume.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def run(model_dir, cycles=CYCLES, **env):
    base = clean_env(VLLM_LOGGING_LEVEL="ERROR", TEST_MODEL=model_dir, RANK="0", LOCAL_RANK="0", TEST_CYCLES=cycles,
                     **env)
    for k in list(base):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) and k not in env:
            del base[k]
    proc = run_python(BODY.read_text(), path=[FAKEVLLM], env=base, timeout=900)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[shim")]
    return lines


def count(lines, level, what):
    pattern = re.compile(rf"^\[shim[^\]]*\] {level} {what}")
    return sum(1 for line in lines if pattern.search(line))


def test_60_cycles_info_lines(model_dir):
    lines = run(model_dir)
    info = [line for line in lines if "] INFO " in line]
    sleeps = [line for line in info if " sleep LLMEngine#1" in line]
    assert len(sleeps) == 2  # the first sleep (read on the device), the first checked from the pool's bookkeeping
    assert "by the pool's bookkeeping" not in sleeps[0] and "by the pool's bookkeeping" in sleeps[1]
    assert count(lines, "INFO", "wake LLMEngine#1") == 1  # the first wake
    first_wake = next(line for line in info if " wake LLMEngine#1" in line)
    assert "further sleep/wake lines are DEBUG (SHIM_DEBUG=1 shows them), a summary every 50 sleeps" in first_wake
    assert count(lines, "INFO", "init LLMEngine#1") == 1
    summaries = [line for line in info if "sleep summary rank 0" in line]
    assert [s.split(": ", 1)[1].split(",")[0] for s in summaries] == ["50 sleeps", "60 sleeps"]  # periodic + exit
    decisions = [line for line in info if re.search(r"\] INFO [a-z0-9-]+ \(.*\): (applied|stand down)", line)]
    assert len(decisions) >= 3  # vllm-sleep-guard, vllm-sleep-check, vllm-llm-sleep-check: applied, ...
    assert len(info) == len(decisions) + 1 + 2 + 1 + 2, "\n".join(info)  # init, 2 sleeps, 1 wake, 2 summaries
    assert not any("WARNING" in line for line in lines)
    assert not any("] DEBUG " in line for line in lines)


def test_debug_brings_every_line_back(model_dir):
    lines = run(model_dir, cycles=12, SHIM_DEBUG="1")
    assert count(lines, "(INFO|DEBUG)", "sleep LLMEngine#1") == 12
    assert count(lines, "(INFO|DEBUG)", "wake LLMEngine#1") == 12
    assert count(lines, "DEBUG", "sleep LLMEngine#1") == 10  # all but the first and the first from the pool


def test_summary_every_n_and_problems_stay_info(model_dir):
    """SHIM_SUMMARY_EVERY=4; NPU with expandable segments on and the guard off: every sleep is
    ineffective (ms-swift #6636), and each one stays an INFO line next to its WARNING."""
    lines = run(model_dir, cycles=9, SHIM_SUMMARY_EVERY="4", FAKEVLLM_DEVICE="npu",
                PYTORCH_ALLOC_CONF="expandable_segments:True", SHIM_DISABLED_PATCHES="vllm-sleep-guard,vllm-worker-sleep-guard")
    sleeps = [line for line in lines if "] INFO sleep LLMEngine#1" in line]
    assert len(sleeps) == 10 and all("INEFFECTIVE" in line for line in sleeps)  # 9 + the reset's re-issued one
    assert sum("first-sleep reset: re-issued" in line for line in sleeps) == 1
    assert count(lines, "INFO", "wake LLMEngine#1") == 1
    summaries = [line for line in lines if "sleep summary rank 0" in line]
    assert [s.split(": ", 1)[1].split(",")[:2] for s in summaries] == [
        ["4 sleeps", " 4 ineffective"], ["8 sleeps", " 8 ineffective"], ["10 sleeps", " 10 ineffective"]]


def test_summary_every_ten_minutes(monkeypatch):
    """A slow run (one sleep every 4 minutes) gets a summary line at least every 10 minutes."""
    now = [1000.0]
    monkeypatch.setattr(events.time, "time", lambda: now[0])
    monkeypatch.setattr(events, "_periodic", {"sleeps": 0, "t": None})
    monkeypatch.setattr(events, "_seen", {})
    monkeypatch.setattr(events, "_last", {})
    monkeypatch.setattr(events, "_summary", dict(events._summary))
    monkeypatch.setattr(events, "_atexit", [True])
    printed = []
    monkeypatch.setattr(events, "summary", lambda: printed.append(now[0]))
    monkeypatch.setattr(log, "event", lambda message, important: None)
    monkeypatch.setenv(config.SHIM_SUMMARY_EVERY, "50")
    monkeypatch.delenv(config.SHIM_TRACE, raising=False)
    for _ in range(8):
        now[0] += 240
        events.emit("sleep", "E#9", 0.1, level=1, tracked=10, freed=10, effective=True, asleep=["weights"])
    # the first event at 1240 s; 12 minutes later (the first sleep past 10 minutes), then again
    assert printed == [1960.0, 2680.0]


def test_summary_every_must_be_a_count(monkeypatch):
    log.forget("switch")
    monkeypatch.setenv(config.SHIM_SUMMARY_EVERY, "often")
    with pytest.raises(config.ConfigError, match="SHIM_SUMMARY_EVERY='often' is not valid; accepted: an integer"):
        config.validate()
    assert config.summary_every() == config.SUMMARY_EVERY_DEFAULT  # read inside emit: the default
    monkeypatch.setenv(config.SHIM_SUMMARY_EVERY, "0")
    assert config.summary_every() == 0


def test_said_once_per_key_until_forgotten(monkeypatch):
    """``log.once`` is the one registry of lines said once per process: True for a key's first call only,
    per key (strings and tuples); ``forget`` frees a key and the tuple keys under it, and no other."""
    lines = []
    monkeypatch.setattr(log, "warning", lambda m: lines.append(("WARNING", m)))
    monkeypatch.setattr(log, "debug", lambda m: lines.append(("DEBUG", m)))
    log.forget("test-once")
    assert [log.once(("test-once", "a")), log.once(("test-once", "a")), log.once(("test-once", "b"))] == \
        [True, False, True]
    assert log.once("test-once") is True and log.once("test-once") is False  # the string is a key of its own
    log.warning_once(("test-once", "w"), "first")
    log.warning_once(("test-once", "w"), "again")
    assert lines == [("WARNING", "first"), ("DEBUG", "again")]
    assert log.once("test-once-other") is True
    log.forget("test-once")
    assert log.once(("test-once", "a")) is True and log.once("test-once") is True
    assert log.once("test-once-other") is False  # not under the prefix: kept
    log.forget("test-once")
    log.forget("test-once-other")
