"""Per-sleep / per-wake overhead of the vLLM sleep guard, on the CPU stand-in.

    python bench/sleep_overhead.py [--cycles 10] [--device cuda|npu]

Builds one tiny sleep-mode engine on the vLLM stand-in (tests/fakevllm) in a
fresh interpreter with the shim off, then one with it on, times ``cycles``
level-1 ``sleep`` + ``wake_up`` pairs in each and prints the medians and the
difference. What the guard adds per sleep: reading the pool's usage,
synchronize + empty_cache + ``mem_get_info`` before, synchronize +
``mem_get_info`` after (on NPU also a young-generation gc + empty_cache: vllm-ascend's
sleep does neither), one event. Per wake: a young-generation gc + empty_cache
(skipped on vLLM >= 0.30, which runs a full gc itself), the allocator guard, one
event. The stand-in's own sleep runs a full gc as vLLM's does, which dominates
both columns in a process with many objects.
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
own = {"sleep": [], "wake": []}
if os.environ.get("SHIM_TRACE"):  # the shim's own seconds per call (its trace's shim_s)
    for line in open(os.environ["SHIM_TRACE"]):
        rec = json.loads(line)
        if rec.get("event") in own and rec.get("shim_s") is not None:
            own[rec["event"]].append(rec["shim_s"])
print(json.dumps({"sleep": sleeps, "wake": wakes, "objects": len(gc.get_objects()), "full_gc": full_gc, "own": own}))
"""


def run(model, cycles, device, shim, trace=""):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIM_", "FAKEVLLM_", "PYTORCH_"))}
    env.update(PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fakevllm"), REPO]),
               BENCH_SHIM="1" if shim else "0", FAKEVLLM_DEVICE=device, VLLM_LOGGING_LEVEL="ERROR")
    if trace:
        env["SHIM_TRACE"] = trace
    proc = subprocess.run([sys.executable, "-c", CHILD, model, str(cycles)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=("cuda", "npu"))
    a = ap.parse_args()
    sys.path.insert(0, REPO)
    from tests.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as d:
        model = make_tiny_model(os.path.join(d, "m"))
        t0 = time.time()
        off = run(model, a.cycles, a.device, False)
        on = run(model, a.cycles, a.device, True, trace=os.path.join(d, "trace.jsonl"))
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"vLLM stand-in ({a.device}), {a.cycles} level-1 cycles, {on['objects']} live Python objects "
          f"(a full gc.collect() takes {1000 * on['full_gc']:.0f} ms here); {time.time() - t0:.0f} s in all")
    print(f"{'':8}{'shim off':>12}{'shim on':>12}{'added':>12}{'shim_s':>12}")
    for what in ("sleep", "wake"):
        own = f"{ms(on['own'][what]):>9.2f} ms" if on["own"][what] else f"{'-':>12}"
        print(f"{what:8}{ms(off[what]):>9.1f} ms{ms(on[what]):>9.1f} ms{ms(on[what]) - ms(off[what]):>9.1f} ms{own}")
    print("added: A/B of the two processes (includes gc-time noise); shim_s: the shim's own time per call, "
          "from its trace (median)")


if __name__ == "__main__":
    main()
