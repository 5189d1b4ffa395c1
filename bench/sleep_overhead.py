"""Per-sleep / per-wake overhead of the shim's sleep check and allocator guard, on the CPU stand-in.

    python bench/sleep_overhead.py [--cycles 20] [--device cuda|npu]

Builds one tiny sleep-mode engine on the vLLM stand-in (tests/fakevllm) in a
fresh interpreter with the shim off, then with it on (default
``SHIM_DEVICE_CHECK_EVERY``, 10), then with it on and ``SHIM_DEVICE_CHECK_EVERY=1``
(every sleep and wake read on the device, the behaviour before the cheap path),
times ``cycles`` level-1 ``sleep`` + ``wake_up`` pairs in each and prints the
medians, the A/B difference and the shim's own time per call (``shim_s`` of its
trace), split by how the call was verified (``measured``):

- ``device``: the pool's usage, synchronize + empty_cache + ``mem_get_info``
  before, synchronize + ``mem_get_info`` after (on NPU also a young-generation gc
  + empty_cache: vllm-ascend's sleep does neither), one event; per wake
  ``mem_get_info`` before and after;
- ``pool``: the pool's usage and the executor's sleeping tags only (no device
  reading; shim.vllm.sleep.sleep_verdict says when this is enough).

Every wake also gives cached blocks back first (young-generation gc +
empty_cache; skipped on vLLM >= 0.30, which does it itself) and runs the
allocator guard. The stand-in's ``mem_get_info`` is a Python sum, far cheaper
than a device round trip: the device-vs-pool gap on a GPU is larger (H200:
``bench/gpu_sleep_memory.py``). The stand-in's own sleep runs a full gc as
vLLM's does, which dominates the first two columns in a process with many objects.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import gc, json, os, sys, time
if os.environ["BENCH_SHIM"] == "1":
    import shim.auto
import vllm
from vllm import LLM
llm = LLM(model=sys.argv[1], enable_sleep_mode=True, gpu_memory_utilization=0.5)
sleeps, wakes = [], []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); llm.sleep(level=1); sleeps.append(time.perf_counter() - t)
    t = time.perf_counter(); llm.wake_up(); wakes.append(time.perf_counter() - t)
t = time.perf_counter(); gc.collect(); full_gc = time.perf_counter() - t
own = {"sleep": {}, "wake": {}}
if os.environ.get("SHIM_TRACE"):  # the shim's own seconds per call (its trace's shim_s), by how it was verified
    for line in open(os.environ["SHIM_TRACE"]):
        rec = json.loads(line)
        if rec.get("event") in own and rec.get("shim_s") is not None:
            own[rec["event"]].setdefault(rec.get("measured") or "device", []).append(rec["shim_s"])
print(json.dumps({"sleep": sleeps, "wake": wakes, "objects": len(gc.get_objects()), "full_gc": full_gc, "own": own}))
"""


def run(model, cycles, device, shim, trace="", every=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIM_", "FAKEVLLM_", "PYTORCH_"))}
    if every is not None:
        env["SHIM_DEVICE_CHECK_EVERY"] = str(every)
    env.update(PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fakevllm"), REPO]),
               BENCH_SHIM="1" if shim else "0", FAKEVLLM_DEVICE=device, VLLM_LOGGING_LEVEL="ERROR")
    if trace:
        env["SHIM_TRACE"] = trace
    proc = subprocess.run([sys.executable, "-c", CHILD, model, str(cycles)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=("cuda", "npu"))
    a = ap.parse_args()
    if a.cycles < 1:
        ap.error("--cycles must be >= 1")
    sys.path.insert(0, REPO)
    from tests.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as d:
        model = make_tiny_model(os.path.join(d, "m"))
        t0 = time.time()
        off = run(model, a.cycles, a.device, False)
        on = run(model, a.cycles, a.device, True, trace=os.path.join(d, "trace.jsonl"))
        every1 = run(model, a.cycles, a.device, True, trace=os.path.join(d, "trace1.jsonl"), every=1)
    ms = lambda xs: 1000 * statistics.median(xs) if xs else float("nan")  # noqa: E731
    print(f"vLLM stand-in ({a.device}), {a.cycles} level-1 cycles, {on['objects']} live Python objects "
          f"(a full gc.collect() takes {1000 * on['full_gc']:.0f} ms here); {time.time() - t0:.0f} s in all")
    print(f"{'':8}{'shim off':>12}{'shim on':>12}{'added':>12}{'shim_s':>12}{'(n)':>6}"
          f"{'device':>12}{'(n)':>6}{'pool':>12}{'(n)':>6}{'every=1':>12}")
    for what in ("sleep", "wake"):
        by = on["own"][what]
        every_call = [x for xs in every1["own"][what].values() for x in xs]
        calls = [x for xs in by.values() for x in xs]
        dev, pool = by.get("device", []), by.get("pool", [])
        print(f"{what:8}{ms(off[what]):>9.1f} ms{ms(on[what]):>9.1f} ms{ms(on[what]) - ms(off[what]):>9.1f} ms"
              f"{ms(calls):>9.3f} ms{len(calls):>6}{ms(dev):>9.3f} ms{len(dev):>6}{ms(pool):>9.3f} ms{len(pool):>6}"
              f"{ms(every_call):>9.3f} ms")
    print("added: A/B of the two processes (includes gc-time noise); shim_s: the shim's own time per call, from its "
          "trace (median), all calls and split by verification (device readings / the pool's bookkeeping); "
          "every=1: SHIM_DEVICE_CHECK_EVERY=1, every call read on the device")


if __name__ == "__main__":
    main()
