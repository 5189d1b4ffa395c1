"""Summary of the two verl 0.9.1 GRPO runs of tests/gpu/verl_grpo.sh (issue 21 item 5).

usage: python3 tests/gpu/verl_grpo_summary.py RESULTS_DIR [OUT_JSON] [--tag _det] [--a plain --b shim]
reads RESULTS_DIR/verl091_{plain,shim}_metrics.jsonl (verl's file logger), verl091_{plain,shim}_rollouts.tgz
(trainer.rollout_data_dir dumps), verl091_shim_trace.jsonl (SHIM_TRACE); writes OUT_JSON (default
RESULTS_DIR/verl091_summary.json): per step reward / rollout_probs_diff / response length of both runs,
per-sample equality of responses and scores, the shim's activations (pid, argv) and every sleep/wake
record (pid, engine, level, freed vs tracked, effective, measured), and the verify-weights records.
"""
import io
import json
import os
import sys
import tarfile

KEYS = ["critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean",
        "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "training/rollout_probs_diff_std",
        "training/rollout_probs_diff_valid", "response_length/mean", "actor/pg_loss", "actor/grad_norm",
        "actor/entropy", "timing_s/step", "timing_s/gen", "timing_s/update_weights"]


def metrics(path):
    if not os.path.exists(path):
        return None
    steps = {}
    for ln in open(path):
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        steps[rec["step"]] = rec["data"]
    return steps


def rollouts(path):
    """{(step, prompt, rollout_k): (response, score)} from the rollout_data_dir dumps."""
    if not os.path.exists(path):
        return None
    out = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.endswith(".jsonl"):
                continue
            step = int(os.path.basename(m.name).split(".")[0])
            for ln in io.TextIOWrapper(tf.extractfile(m)):
                r = json.loads(ln)
                uid = r.get("uid", "")
                parts = uid.rsplit("_", 2)
                k = int(parts[1]) if len(parts) == 3 else 0
                key = (step, r["input"], k)
                while key in out:  # same prompt twice in a step: keep both
                    key = key + ("dup",)
                out[key] = (r["output"], r["score"])
    return out


def trace(path):
    if not os.path.exists(path):
        return None
    recs = [json.loads(ln) for ln in open(path) if ln.strip()]
    acts = [{"pid": r.get("pid"), "ppid": r.get("ppid"), "rank": r.get("rank"), "argv": (r.get("argv") or [])[:4]}
            for r in recs if r.get("event") == "activate"]
    ev = [{k: r.get(k) for k in ("event", "pid", "ppid", "rank", "engine", "level", "tags", "tracked", "freed",
                                  "restored", "taken", "effective", "measured", "seconds", "shim_s", "note", "free",
                                  "total")}
          for r in recs if r.get("event") in ("init", "sleep", "wake")]
    other = {}
    for r in recs:
        if r.get("event") not in ("activate", "init", "sleep", "wake"):
            other.setdefault(r.get("event"), []).append(r)
    sleeps = [e for e in ev if e["event"] == "sleep"]
    gib = 1 << 30
    return {"records": len(recs), "activations": acts, "events": ev,
            "sleeps": {"n": len(sleeps), "effective": sum(1 for s in sleeps if s["effective"]),
                       "ineffective": sum(1 for s in sleeps if s["effective"] is False),
                       "freed_gib": [round((s["freed"] or 0) / gib, 3) for s in sleeps],
                       "tracked_gib": [round((s["tracked"] or 0) / gib, 3) for s in sleeps],
                       "pids": sorted({s["pid"] for s in sleeps})},
            "other_events": {k: v[:5] for k, v in other.items()}}


def main():
    args = sys.argv[1:]
    opt = {}
    for k in ("--tag", "--a", "--b"):
        if k in args:
            i = args.index(k); opt[k] = args[i + 1]; del args[i:i + 2]
    tag = opt.get("--tag", "")
    na, nb = opt.get("--a", "plain") + tag, opt.get("--b", "shim") + tag
    d = args[0]
    out = args[1] if len(args) > 1 else os.path.join(d, f"verl091{tag}_summary.json")
    res = {"runs": {}, "compared": [na, nb]}
    for name in (na, nb):
        m = metrics(os.path.join(d, f"verl091_{name}_metrics.jsonl"))
        res["runs"][name] = None if m is None else {str(s): {k: m[s].get(k) for k in KEYS if k in m[s]} for s in sorted(m)}
    ro = {n: rollouts(os.path.join(d, f"verl091_{n}_rollouts.tgz")) for n in (na, nb)}
    if ro[na] and ro[nb]:
        a, b = ro[na], ro[nb]
        common = sorted(set(a) & set(b), key=str)
        same_resp = sum(1 for k in common if a[k][0] == b[k][0])
        same_score = sum(1 for k in common if a[k][1] == b[k][1])
        per_step = {}
        for k in common:
            s = per_step.setdefault(str(k[0]), {"samples": 0, "same_response": 0, "same_score": 0,
                                                 "score_sum_" + na: 0.0, "score_sum_" + nb: 0.0})
            s["samples"] += 1; s["same_response"] += a[k][0] == b[k][0]; s["same_score"] += a[k][1] == b[k][1]
            s["score_sum_" + na] += a[k][1]; s["score_sum_" + nb] += b[k][1]
        res["rollouts_compared"] = {na: len(a), nb: len(b), "matched_keys": len(common),
                                    "same_response": same_resp, "same_score": same_score, "per_step": per_step,
                                    "first_differences": [{"key": list(map(str, k)), na: a[k], nb: b[k]}
                                                          for k in common if a[k] != b[k]][:5]}
    res["shim_trace"] = trace(os.path.join(d, f"verl091_{nb}_trace.jsonl"))
    json.dump(res, open(out, "w"), indent=1, default=str)
    print(json.dumps({k: v for k, v in res.items() if k != "shim_trace"}, indent=1, default=str)[:6000])
    t = res["shim_trace"]
    if t:
        print("trace:", t["records"], "records;", len(t["activations"]), "activations; sleeps", t["sleeps"])


if __name__ == "__main__":
    main()
