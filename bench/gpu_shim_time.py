"""Where the shim's own time per sleep / wake goes, on a real engine.

    python bench/gpu_shim_time.py --model DIR [--cycles 20] [--out gpu_shim_time.json] [--after MARKER ...]

One process: ``import shim.auto``, then ``LLM(DIR, enable_sleep_mode=True,
kv_cache_memory_bytes=8 GiB, enforce_eager=True)`` and ``--cycles`` cycles of
``sleep(1)`` / ``wake_up()`` and of ``sleep(2)`` / ``wake_up()`` /
``collective_rpc("reload_weights")``. Each step of the shim's sleep check is timed
by a wrapper put on its module attribute (inclusive microseconds per call,
median; the wrapper's own ~1 us included), next to the shim's own seconds per
call from its trace (``shim_s``) and vLLM's call. Also timed alone, 200 times
each: ``gc.collect(1)``, ``torch.cuda.synchronize()``, ``torch.cuda.empty_cache()``,
``torch.cuda.mem_get_info()``.

Runs on CPU against tests/fakevllm too (``PYTHONPATH=tests/fakevllm``), to debug it.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402

# (module, attribute): the steps of the sleep check's sleep and wake (the engine's SleepState) that it calls
# through a module
STEPS = [("memory", "probe"), ("memory", "release_cached"), ("memory", "read_before_sleep"),
         ("memory", "after_sleep"), ("sleep_pool", "tracked_bytes"), ("sleep_pool", "bytes_by_tag"),
         ("call_args", "arg"), ("wake_plan", "plan"), ("engines", "executor_of"), ("engines", "reported_asleep"),
         ("sleep_state", "state_for"), ("sleep_verdict", "reading_due"), ("sleep_verdict", "judge"),
         ("alloc_guard", "suspend"), ("alloc_guard", "resume"), ("events", "emit")]


LAYER = {"call_args": "engine", "events": "observe", "engines": "vllm"}  # the other modules are in shim/vllm/sleep


def timed(table: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table.setdefault(key, []).append(time.perf_counter() - t0)
    return wrapper


def micro(fn, n=200) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--out", default="")
    p.add_argument("--after", nargs="*", default=[])
    p.add_argument("--done", default="")
    a = p.parse_args(argv)
    trace = os.path.join(tempfile.mkdtemp(prefix="shim-time-"), "trace.jsonl")
    os.environ["SHIM_TRACE"] = trace
    import importlib

    import torch
    from vllm import LLM, SamplingParams

    import shim.auto  # noqa: F401

    table: dict = {}
    for mod, attr in STEPS:
        m = importlib.import_module(f"shim.{LAYER.get(mod, 'vllm.sleep')}.{mod}")
        setattr(m, attr, timed(table, f"{mod}.{attr}", getattr(m, attr)))
    reason = common.Gate(a.after, label="shimtime").wait(common.deadline(), 60.0)
    if reason:
        print(reason)
        if a.done:
            open(a.done, "w").close()
        return 0
    kw = dict(model=a.model, enable_sleep_mode=True, enforce_eager=True, max_model_len=256, max_num_seqs=16,
              seed=0, gpu_memory_utilization=0.3)
    if torch.cuda.is_available():
        kw.update(kv_cache_memory_bytes=8 << 30, dtype="bfloat16")
    llm = LLM(**kw)
    sp = SamplingParams(max_tokens=8, temperature=0.0)
    llm.generate(["hello world"], sp, use_tqdm=False)
    calls: dict = {}
    per_phase: dict = {}
    for level in (1, 2):
        for cycle in range(a.cycles):
            for what, fn in (("sleep", lambda: llm.sleep(level=level)), ("wake", lambda: llm.wake_up())):
                before = {k: len(v) for k, v in table.items()}
                t0 = time.perf_counter()
                fn()
                calls.setdefault(f"{what} L{level}", []).append(time.perf_counter() - t0)
                if cycle:  # the first cycle of a level reads the device: kept out of the steady state
                    for k, v in table.items():
                        if len(v) > before.get(k, 0):
                            per_phase.setdefault(f"{what} L{level}", {}).setdefault(k, []).extend(
                                v[before.get(k, 0):])
            if level == 2:
                llm.collective_rpc("reload_weights")
            llm.generate(["hello world"], sp, use_tqdm=False)
    own: dict = {}
    level = None
    for line in open(trace):
        rec = json.loads(line)
        if rec.get("event") == "sleep":
            level = rec.get("level")
        if rec.get("event") in ("sleep", "wake") and rec.get("shim_s") is not None and level:
            own.setdefault(f"{rec['event']} L{level}", []).append((rec["shim_s"], rec.get("measured")))
    dev = {}
    if torch.cuda.is_available():
        dev = {"gc.collect(1)": micro(lambda: gc.collect(1)), "torch.cuda.synchronize()": micro(torch.cuda.synchronize),
               "torch.cuda.empty_cache()": micro(torch.cuda.empty_cache),
               "torch.cuda.mem_get_info()": micro(torch.cuda.mem_get_info)}
    else:
        dev = {"gc.collect(1)": micro(lambda: gc.collect(1))}
    result = {"what": "the shim's own time per sleep/wake, by step", "cycles": a.cycles, "env": common.env_info(),
              "calls_ms": {k: 1000 * statistics.median(v[1:] or v) for k, v in calls.items()},
              "shim_ms": {k: 1000 * statistics.median([s for s, _ in v[1:]] or [s for s, _ in v]) for k, v in own.items()},
              "measured": {k: sorted({m for _, m in v[1:]}, key=str) for k, v in own.items()},
              "steps_us": {ph: {k: 1e6 * statistics.median(v) for k, v in steps.items()}
                           for ph, steps in per_phase.items()},
              "steps_calls_per_call": {ph: {k: len(v) / max(a.cycles - 1, 1) for k, v in steps.items()}
                                       for ph, steps in per_phase.items()},
              "device_us": {k: 1e6 * v for k, v in dev.items()}}
    for k in result["calls_ms"]:
        if k in result["shim_ms"]:
            print(f"{k}: vLLM {result['calls_ms'][k]:.3f} ms, shim {result['shim_ms'][k]:.3f} ms "
                  f"({100 * result['shim_ms'][k] / result['calls_ms'][k]:.2f}% of the call; wrappers included)")
        for step, us in sorted(result["steps_us"].get(k, {}).items(), key=lambda kv: -kv[1]):
            print(f"    {step:28s} {us:8.1f} us x {result['steps_calls_per_call'][k][step]:.1f}")
    for k, v in result["device_us"].items():
        print(f"{k:28s} {v:8.1f} us")
    if a.out:
        common.write_json(a.out, result)
    if a.done:
        open(a.done, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
