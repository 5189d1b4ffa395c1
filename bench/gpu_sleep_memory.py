"""vLLM sleep mode on real memory: what each sleep frees, with and without the shim, per allocator route.

    python bench/gpu_sleep_memory.py [--cycles 8] [--workdir /tmp/shim-gpu/sleep]
        [--out bench/results/gpu_sleep_memory.json] [--only NAME ...]
    python bench/gpu_sleep_memory.py --one NAME --model DIR --out RUN.json    (one configuration; used by the above)

Needs CUDA and real vLLM. One process per configuration (the allocator routes
are read when CUDA starts), one at a time (``torch.cuda.mem_get_info`` is
device-wide); their imports overlap. Each builds ``LLM(wide Qwen2 (2.1 GiB of
bf16 weights), enable_sleep_mode=True, kv_cache_memory_bytes=8 GiB)``, takes a
greedy reference output, then runs ``--cycles`` cycles of ``sleep(1)`` /
``wake_up()`` and of ``sleep(2)`` / ``wake_up()`` / ``collective_rpc("reload_weights")``,
checking the greedy output after each wake. Per sleep it records the bytes the
sleep pool tracked (``CuMemAllocator.get_current_usage()``) and what the device got back
(``mem_get_info`` after synchronize + gc + ``empty_cache``, before and after),
the seconds of the ``sleep`` / ``wake_up`` call itself, and the allocator
settings (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``, the live setting).
With the shim, its own per-sleep figures (``SHIM_TRACE``) are compared with
these.

Configurations (``--only`` picks some):

    vllm            no shim, expandable segments off         (timing reference)
    shim            shim on                                  (timing with the shim; first sleep included)
    shim-alloc-conf shim on, PYTORCH_ALLOC_CONF=expandable_segments:True
    shim-cuda-conf  shim on, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    shim-live       shim on, torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    shim-graphs     shim on, enforce_eager=False (CUDA graphs: how much stays outside the pool)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402

ES_ON = "expandable_segments:True"
CONFIGS = {
    # name: (shim, env, live, eager)
    "vllm": ("off", {}, False, True),
    "shim": ("on", {}, False, True),
    "shim-alloc-conf": ("on", {"PYTORCH_ALLOC_CONF": ES_ON}, False, True),
    "shim-cuda-conf": ("on", {"PYTORCH_CUDA_ALLOC_CONF": ES_ON}, False, True),
    "shim-live": ("on", {}, True, True),
    "shim-graphs": ("on", {}, False, False),
}
NEED_S = {"shim-graphs": 150.0}
PROMPTS = ["hello world", "the cat is", "one plus two equals", "red blue green", "the sky is", "big dog",
           "what is the answer", "the sun and the moon"]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", default="", choices=["", *CONFIGS], help="run one configuration in this process")
    p.add_argument("--only", nargs="*", default=[], help="configurations to run (default: all)")
    p.add_argument("--merge", nargs=2, default=None, metavar=("NEW", "OLD"),
                   help="write --out from two results files: NEW's runs, plus OLD's runs that NEW lacks")
    p.add_argument("--model", default="")
    p.add_argument("--size", default="wide", choices=sorted(common.SIZES))
    p.add_argument("--workdir", default="/tmp/shim-gpu/sleep")
    p.add_argument("--out", default="")
    p.add_argument("--cycles", type=int, default=8, help="sleep/wake cycles per level")
    p.add_argument("--levels", default="1,2")
    p.add_argument("--kv-bytes", type=int, default=8 << 30)
    p.add_argument("--trace", default="", help="SHIM_TRACE of this configuration (--one)")
    p.add_argument("--pythonpath", action="append", default=[])
    p.add_argument("--after", nargs="*", default=[])
    p.add_argument("--done", default="")
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args(argv)
    try:
        a.levels = [int(x) for x in a.levels.split(",") if x]
        assert a.levels and all(x in (1, 2) for x in a.levels)
    except (ValueError, AssertionError):
        p.error("--levels is a comma list of 1 and 2")
    unknown = [n for n in a.only if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration {unknown[0]!r} (known: {', '.join(CONFIGS)})")
    if a.one and not (a.model and a.out):
        p.error("--one needs --model and --out")
    return a


# ---------------------------------------------------------------------------
# one configuration (child process)
# ---------------------------------------------------------------------------
def one(a) -> int:
    shim_on, _env, live, eager = CONFIGS[a.one]
    if a.trace:
        os.environ["SHIM_TRACE"] = a.trace
    if shim_on == "on":
        import shim.auto  # noqa: F401

    import torch
    from vllm import LLM, SamplingParams

    reason = common.Gate(a.after, label=f"sleep {a.one}").wait(common.deadline(), NEED_S.get(a.one, 75.0))
    if reason:
        common.write_json(a.out, {"name": a.one, "skipped": reason})
        print(f"[{a.one}] {reason}")
        return 0
    if torch.cuda.is_available():  # (tests/fakevllm on CPU: the stand-in fakes mem_get_info)
        torch.cuda.init()
        torch.empty(1, device="cuda")
    if live:
        torch.cuda.memory._set_allocator_settings(ES_ON)  # the user's live setting
    settings0 = common.allocator_settings()

    def measure():
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]

    def pool():
        from vllm.device_allocator.cumem import CuMemAllocator

        return CuMemAllocator.get_instance().get_current_usage()

    kw = dict(model=a.model, enable_sleep_mode=True, enforce_eager=eager, gpu_memory_utilization=0.3,
              kv_cache_memory_bytes=a.kv_bytes, max_model_len=256, max_num_seqs=16, max_num_batched_tokens=2048,
              seed=0, dtype="bfloat16")
    if not eager:
        kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}
    free0 = measure()
    t = time.perf_counter()
    llm = LLM(**kw)
    init_s = time.perf_counter() - t
    free1 = measure()
    pool_init = pool()
    init = {"seconds": init_s, "engine_bytes": free0 - free1, "pool_bytes": pool_init,
            "outside_pool_bytes": (free0 - free1) - pool_init, "settings_after": common.allocator_settings()}
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def gen():
        return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]  # noqa: F821 (deleted at the end, after its last call)

    ref = gen()
    sleeps = []
    for level in a.levels:
        for cycle in range(a.cycles):
            tracked = pool()
            f0 = measure()
            t = time.perf_counter()
            llm.sleep(level=level)
            sleep_s = time.perf_counter() - t
            f1 = measure()
            settings_asleep = common.allocator_settings()
            t = time.perf_counter()
            llm.wake_up()
            wake_s = time.perf_counter() - t
            reload_s = None
            if level == 2:
                t = time.perf_counter()
                llm.collective_rpc("reload_weights")
                reload_s = time.perf_counter() - t
            f2 = measure()
            out = gen()
            sleeps.append({"level": level, "cycle": cycle, "tracked": tracked, "freed": f1 - f0,
                           "restored": f1 - f2, "fraction": (f1 - f0) / tracked if tracked else None,
                           "sleep_s": sleep_s, "wake_s": wake_s, "reload_s": reload_s,
                           "greedy_same": out == ref,
                           "settings_same_asleep": settings_asleep == settings0,
                           "settings_same_awake": common.allocator_settings() == settings0})
    settings_end = common.allocator_settings()
    shim_events = telemetry_events(a.trace)
    agreement = agree(sleeps, shim_events)
    decisions = {}
    if "shim" in sys.modules:
        from shim.engine import registry

        decisions = {k: d.text() for k, d in registry.decisions().items()
                     if k.startswith("vllm")}
    result = {"name": a.one, "shim": shim_on, "env_route": _env, "live_route": live, "eager": eager,
              "model": common.model_info(a.model), "engine_kw": {k: v for k, v in kw.items() if k != "model"},
              "settings_before": settings0, "settings_end": settings_end, "settings_restored": settings_end == settings0,
              "init": init, "sleeps": sleeps, "shim_events": shim_events, "shim_vs_mem_get_info": agreement,
              "shim_own_time": own_time(shim_events),
              "decisions": decisions, "summary": summarize(sleeps), "env": common.env_info()}
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    common.write_json(a.out, result)
    s = result["summary"]
    print(f"[{a.one}] pool {pool_init / common.GiB:.2f} GiB, outside {init['outside_pool_bytes'] / common.GiB:.2f} GiB;"
          f" {json.dumps(s)}; shim vs mem_get_info {agreement}")
    return 0


def telemetry_events(trace: str) -> list:
    if not trace or not os.path.exists(trace):
        return []
    events = []
    with open(trace) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("pid") == os.getpid():
                events.append({k: rec.get(k) for k in ("event", "level", "tags", "tracked", "freed", "restored",
                                                       "taken", "effective", "seconds", "shim_s", "note")})
    return events


def own_time(events: list) -> dict:
    """The shim's own seconds around each sleep / wake call (``shim_s`` of its trace records: the
    measurements, the gc + ``empty_cache`` before a wake, the bookkeeping), against the seconds of
    vLLM's call, median per level. A wake belongs to the level of the sleep before it."""
    out, level = {}, None
    for e in events:
        if e["event"] == "sleep":
            level = e.get("level")
        if e["event"] not in ("sleep", "wake") or e.get("shim_s") is None or level is None:
            continue
        key = f"{e['event']} L{level}"
        out.setdefault(key, {"shim_s": [], "call_s": []})
        out[key]["shim_s"].append(e["shim_s"])
        out[key]["call_s"].append(e["seconds"])
    medians = {k: (_median(v["shim_s"]), _median(v["call_s"]), len(v["shim_s"])) for k, v in out.items()}
    return {k: {"shim_s": own, "call_s": call, "ratio": own / call if call else None, "n": n}
            for k, (own, call, n) in medians.items()}


def agree(sleeps: list, events: list) -> dict:
    """The shim's per-sleep figures against this script's, sleep by sleep."""
    shim_sleeps = [e for e in events if e["event"] == "sleep" and e.get("effective") is not None]
    if not shim_sleeps:
        return {"n": 0}
    pairs = list(zip(sleeps, shim_sleeps))
    rel = [abs((e["freed"] or 0) - s["freed"]) / max(s["freed"], 1) for s, e in pairs]
    rel_tracked = [abs((e["tracked"] or 0) - s["tracked"]) / max(s["tracked"], 1) for s, e in pairs]
    return {"n": len(pairs), "n_shim": len(shim_sleeps), "n_script": len(sleeps),
            "max_rel_diff_freed": max(rel), "max_rel_diff_tracked": max(rel_tracked),
            "within_1pct": max(rel) <= 0.01 and max(rel_tracked) <= 0.01,
            "all_effective": all(e.get("effective") for e in shim_sleeps)}


def _median(xs: list):
    xs = sorted(xs)
    n = len(xs)
    return None if not n else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def summarize(sleeps: list) -> dict:
    """Per level: seconds are medians over the cycles (the first level-1 sleep also pins host memory)."""
    out = {}
    for level in sorted({s["level"] for s in sleeps}):
        ss = [s for s in sleeps if s["level"] == level]
        fr = [s["fraction"] for s in ss if s["fraction"] is not None]
        out[f"L{level}"] = {
            "first_fraction": ss[0]["fraction"], "min_fraction": min(fr) if fr else None,
            "tracked_gib": ss[0]["tracked"] / common.GiB,
            "sleep_s": _median([s["sleep_s"] for s in ss]), "wake_s": _median([s["wake_s"] for s in ss]),
            "reload_s": _median([s["reload_s"] for s in ss]) if level == 2 else None,
            "first_sleep_s": ss[0]["sleep_s"], "first_wake_s": ss[0]["wake_s"],
            "greedy_same": all(s["greedy_same"] for s in ss),
            "settings_same": all(s["settings_same_asleep"] and s["settings_same_awake"] for s in ss)}
    return out


# ---------------------------------------------------------------------------
# orchestrator
# ---------------------------------------------------------------------------
def orchestrate(a) -> int:
    os.makedirs(a.workdir, exist_ok=True)
    model = common.ensure_model(a.model, a.workdir, a.size)
    names = a.only or list(CONFIGS)
    procs, previous = [], list(a.after)

    def start(name, previous, suffix=""):
        shim_on, env, _live, _eager = CONFIGS[name]
        out = os.path.join(a.workdir, f"{name}{suffix}.json")
        log = os.path.join(a.workdir, f"{name}{suffix}.log")
        trace = os.path.join(a.workdir, f"{name}{suffix}.trace.jsonl") if shim_on == "on" else ""
        marker = os.path.join(a.workdir, f"{name}{suffix}.done")
        for stale in (out, marker, trace):
            if stale and os.path.exists(stale):
                os.unlink(stale)
        args = ["--one", name, "--model", model, "--out", out, "--cycles", a.cycles,
                "--levels", ",".join(map(str, a.levels)), "--kv-bytes", a.kv_bytes]
        if trace:
            args += ["--trace", trace]
        if previous:
            args += ["--after", *previous]
        child_env = {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
                     "TOKENIZERS_PARALLELISM": "false"}
        return (name, common.launch(os.path.abspath(__file__), args, log, env=child_env,
                                    pythonpath=a.pythonpath), out, log, marker)

    def collect(name, proc, out, log, marker):
        rc = common.finish(proc, marker, timeout=max(end - time.time(), 1))
        r = common.read_json(out) or {"name": name}
        r["rc"], r["log"] = rc, log
        if rc != 0 or ("sleeps" not in r and "skipped" not in r):
            r["error"] = f"exit {rc}: " + common.tail(log, 12)
        return r

    for name in names:
        procs.append(start(name, previous))
        previous = [procs[-1][4]]
    results = {}
    end = time.time() + a.timeout
    for item in procs:
        results[item[0]] = collect(*item)
    for name, _proc, _out, log, _marker in procs:
        if results[name].get("error") and common.sleep_overlap_crash(log):
            # another process allocated during one of its sleeps: once more, alone, after everything else
            reason = f"vLLM's sleep check failed ({common.SLEEP_OVERLAP}); run once more, alone"
            print(f"[{name}] {reason}", flush=True)
            first = results[name]
            results[name] = collect(*start(name, [p[4] for p in procs], suffix=".retry"))
            results[name]["retried"] = reason
            results[name]["first_attempt"] = {k: first.get(k) for k in ("rc", "error", "log")}
    if a.done:
        open(a.done, "w").close()
    timing, memory, checks = tables(results)
    record = {"what": "vLLM sleep mode on real memory, with and without the shim (issue 7, items 2 and 3)",
              "model": common.model_info(model), "cycles": a.cycles, "kv_cache_memory_bytes": a.kv_bytes,
              "checks": checks, "timing_md": timing, "memory_md": memory, "runs": results}
    out = a.out or str(common.RESULTS_DIR / "gpu_sleep_memory.json")
    return common.publish(out, record, results, timing + "\n\n" + memory, checks)


def _pct(x):
    return None if x is None else f"{100 * x:.2f}%"


def tables(results: dict):
    def s(name, level, key):
        return ((results.get(name) or {}).get("summary") or {}).get(f"L{level}", {}).get(key)

    timing_rows = []
    for name in ("vllm", "shim"):
        if name in results and results[name].get("summary"):
            timing_rows.append({"run": name, "sleep L1 s": s(name, 1, "sleep_s"), "wake L1 s": s(name, 1, "wake_s"),
                                "sleep L2 s": s(name, 2, "sleep_s"), "wake L2 s": s(name, 2, "wake_s"),
                                "reload_weights s": s(name, 2, "reload_s")})
    overhead = {}
    if len(timing_rows) == 2:
        base, sh = timing_rows
        row = {"run": "shim overhead (A/B of two processes)"}
        for col in ("sleep L1 s", "wake L1 s", "sleep L2 s", "wake L2 s"):
            if base.get(col) and sh.get(col) is not None:
                overhead[col] = sh[col] / base[col] - 1
                row[col] = _pct(overhead[col])
        timing_rows.append(row)
    own = (results.get("shim") or {}).get("shim_own_time") or {}
    own_ratio = {}
    if own:
        row = {"run": "shim's own time (its trace)"}
        for col in ("sleep L1 s", "wake L1 s", "sleep L2 s", "wake L2 s"):
            o = own.get(col[:-2])
            if o and o.get("ratio") is not None:
                own_ratio[col] = o["ratio"]
                row[col] = f"{1000 * o['shim_s']:.2f} ms = {_pct(o['ratio'])}"
        timing_rows.append(row)
    timing = "seconds per call, median of the cycles\n\n" + common.fmt_table(timing_rows, ["run", "sleep L1 s", "wake L1 s", "sleep L2 s", "wake L2 s",
                                            "reload_weights s"])
    mem_rows, checks = [], {"shim_overhead": overhead, "shim_own_time": own_ratio}
    for name, r in results.items():
        if not r.get("summary"):
            mem_rows.append({"config": name, "status": r.get("skipped") or "failed"})
            continue
        agreement = r.get("shim_vs_mem_get_info") or {}
        mem_rows.append({
            "config": name, "pool GiB": r["init"]["pool_bytes"] / common.GiB,
            "outside pool GiB": r["init"]["outside_pool_bytes"] / common.GiB,
            "first sleep freed": _pct(s(name, 1, "first_fraction") if 1 in _levels(r) else s(name, 2, "first_fraction")),
            "min freed L1": _pct(s(name, 1, "min_fraction")), "min freed L2": _pct(s(name, 2, "min_fraction")),
            "greedy output kept": all(v.get("greedy_same") for v in r["summary"].values()),
            "setting restored": r["settings_restored"] and all(v.get("settings_same") for v in r["summary"].values()),
            "shim vs mem_get_info": None if not agreement.get("n") else _pct(agreement["max_rel_diff_freed"]),
            "status": "ok"})
        fr = [x["fraction"] for x in r["sleeps"] if x["fraction"] is not None]
        checks[name] = {"every_sleep_freed_99pct": bool(fr) and min(fr) >= 0.99,
                        "settings_restored": mem_rows[-1]["setting restored"],
                        "greedy_kept": mem_rows[-1]["greedy output kept"],
                        "shim_within_1pct": agreement.get("within_1pct") if agreement.get("n") else None,
                        "outside_pool_gib": round(r["init"]["outside_pool_bytes"] / common.GiB, 3)}
    memory = common.fmt_table(mem_rows, ["config", "pool GiB", "outside pool GiB", "first sleep freed", "min freed L1",
                                         "min freed L2", "greedy output kept", "setting restored",
                                         "shim vs mem_get_info", "status"])
    return timing, memory, checks


def _levels(r):
    return {x["level"] for x in r.get("sleeps", [])}


def merge(new_path: str, old_path: str, out: str) -> int:
    """One results file from a run of some configurations (``--only``) and an earlier run of the
    others: NEW's runs and tables, OLD's runs that NEW lacks; ``runs_from`` says which file,
    date and shim commit each run comes from."""
    new, old = common.read_json(new_path), common.read_json(old_path)
    if new is None or old is None:
        print(f"cannot read {new_path if new is None else old_path}", file=sys.stderr)
        return 2
    results = dict(new["runs"])
    src = {name: {"date": new["env"].get("date"), "shim_commit": new["env"].get("shim_commit")} for name in results}
    for name, r in old["runs"].items():
        if name not in results:
            results[name] = r
            src[name] = {"date": old["env"].get("date"), "shim_commit": old["env"].get("shim_commit")}
    timing, memory, checks = tables(results)
    record = {**new, "checks": checks, "timing_md": timing, "memory_md": memory, "runs": results, "runs_from": src,
              "env_of_older_runs": old["env"]}
    common.write_json(out, record)
    print(timing + "\n\n" + memory)
    return 0


def main(argv=None) -> int:
    a = parse(argv)
    if a.merge:
        return merge(*a.merge, a.out or str(common.RESULTS_DIR / "gpu_sleep_memory.json"))
    if a.one:
        try:
            return one(a)
        except BaseException:
            traceback.print_exc()
            return 1
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
