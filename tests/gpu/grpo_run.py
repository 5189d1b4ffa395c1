"""One real TRL GRPOTrainer run with vLLM colocated on the GPU; writes a JSON summary.

    python tests/gpu/grpo_run.py --model DIR --out RUN.json [--sleep on|off] [--shim on|off]
        [--steps 6] [--lr 3e-3] [--observe] [--engine-kw JSON] [--after MARKER ...]
        [--barrier DIR:NAME:N] [--trace TRACE.jsonl] [--need-s 90] [--lora] [--drop NAME]

TRL is whatever release is first on PYTHONPATH (one folder per version); vLLM
is the real one (or tests/fakevllm, to debug this script on CPU). ``--shim on``
imports ``shim.auto`` before TRL.

Observation (test-side instrumentation, not the shim's): ``vllm.LLM.generate``
is wrapped so that right before vLLM samples, every parameter of the engine's
model (``llm.llm_engine.model_executor.driver_worker.model_runner.model``) is
compared with the trainer model's current parameter (rounded to the engine's
dtype, q/k/v and gate/up concatenated as vLLM fuses them) and with the initial
checkpoint on disk; a float64 checksum of each is recorded too. Also timed:
every step (TrainerCallback), every ``LLM.sleep`` / ``LLM.wake_up`` (the engine's
own call, inner to any wrapper TRL or the shim adds), the weight pushes
(``VLLMGeneration.sync_weights``) and the ``reload_weights`` calls that reach
vLLM. ``--engine-kw`` adds keyword arguments to the ``LLM(...)`` TRL builds
(defaults only: a keyword TRL passes wins), e.g. ``enforce_eager`` and
``kv_cache_memory_bytes`` so several runs can share one GPU without vLLM's
memory profiler seeing each other.

``--lora`` (issue 30 item 2): the bf16 model wrapped by TRL in a PEFT LoRA (rank 4 on ``q_proj``/``v_proj``,
non-zero from the start); the summary gets ``base_changed_elements``, the frozen base's elements that differ
from the checkpoint after training (upstream's in-place merge/unmerge drifts them; the shim's
``trl-lora-merge-drift`` keeps them). ``--drop NAME``: a fault, every push into the engine silently leaves
out the tensors whose name contains NAME (the engine model's ``load_weights``, in-process engine), which
weight verification (``SHIM_VERIFY_WEIGHTS=1``) must report as stale.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository (shim, tests)

from tests.gpu import common  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="local model folder (tests.gpu.common.make_model)")
    p.add_argument("--out", required=True, help="JSON summary to write")
    p.add_argument("--label", default="")
    p.add_argument("--sleep", choices=("on", "off"), default="on")
    p.add_argument("--shim", choices=("on", "off"), default="off")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size")
    p.add_argument("--gens", type=int, default=4, help="num_generations")
    p.add_argument("--completion", type=int, default=16, help="max_completion_length")
    p.add_argument("--gpu-util", type=float, default=0.1, help="vllm_gpu_memory_utilization")
    p.add_argument("--observe", action="store_true", help="compare the engine's weights at every rollout")
    p.add_argument("--engine-kw", default="{}", help="JSON: extra LLM(...) keywords (defaults)")
    p.add_argument("--after", nargs="*", default=[], help="marker files to wait for before using the GPU")
    p.add_argument("--barrier", default="", help="DIR:NAME:N: wait for N processes after CUDA init")
    p.add_argument("--trace", default="", help="SHIM_TRACE path (set before the shim is imported)")
    p.add_argument("--need-s", type=float, default=90.0, help="seconds this run needs (deadline check)")
    p.add_argument("--lora", action="store_true", help="PEFT LoRA (rank 4, q_proj/v_proj) on the bf16 model")
    p.add_argument("--drop", default="", help="fault: every push leaves out the tensors whose name contains this")
    a = p.parse_args(argv)
    try:
        a.engine_kw = json.loads(a.engine_kw)
        assert isinstance(a.engine_kw, dict)
    except (ValueError, AssertionError):
        p.error(f"--engine-kw must be a JSON object, got {a.engine_kw!r}")
    if a.barrier and len(a.barrier.rsplit(":", 2)) != 3:
        p.error("--barrier must be DIR:NAME:N")
    if a.steps < 1 or a.batch % a.gens:
        p.error("--steps must be >= 1 and --batch a multiple of --gens")
    return a


class Recorder:
    """Instrumentation of vllm.LLM and TRL's VLLMGeneration for one run."""

    def __init__(self, args):
        self.args = args
        self.trainer = None
        self.checkpoint = None
        self.generates = []
        self.generate_calls = 0
        self.sleeps = []
        self.reloads = 0
        self.pushes = []
        self.step_times = []
        self.engine_init = {}
        self.dropped = 0

    # -- vllm.LLM ------------------------------------------------------------
    def install_llm(self, LLM):
        rec = self
        orig_init, orig_generate = LLM.__init__, LLM.generate
        orig_sleep, orig_wake, orig_rpc = LLM.sleep, LLM.wake_up, LLM.collective_rpc

        def __init__(self, *a, **kw):
            for k, v in rec.args.engine_kw.items():
                kw.setdefault(k, v)
            rec.engine_init["kwargs"] = {k: v for k, v in kw.items() if isinstance(v, (int, float, str, bool))}
            free0 = _free()
            t = time.perf_counter()
            orig_init(self, *a, **kw)
            rec.engine_init["seconds"] = time.perf_counter() - t
            rec.engine_init["took_bytes"] = (free0 - _free()) if free0 is not None else None
            rec.engine_init["pool_bytes"] = _pool_usage()
            if rec.args.drop:
                rec.install_drop(self)

        def generate(self, *a, **kw):
            rec.generate_calls += 1
            if rec.args.observe:
                rec.observe(self)
            return orig_generate(self, *a, **kw)

        def sleep(self, *a, **kw):
            level = kw.get("level", a[0] if a else 1)
            t = time.perf_counter()
            out = orig_sleep(self, *a, **kw)
            rec.sleeps.append({"op": "sleep", "level": level, "s": time.perf_counter() - t, "step": rec.step()})
            return out

        def wake_up(self, *a, **kw):
            tags = kw.get("tags", a[0] if a else None)
            t = time.perf_counter()
            out = orig_wake(self, *a, **kw)
            rec.sleeps.append({"op": "wake", "tags": list(tags) if tags else None, "s": time.perf_counter() - t,
                               "step": rec.step()})
            return out

        def collective_rpc(self, method, *a, **kw):
            if method == "reload_weights":
                rec.reloads += 1
            return orig_rpc(self, method, *a, **kw)

        LLM.__init__, LLM.generate, LLM.sleep, LLM.wake_up, LLM.collective_rpc = (
            __init__, generate, sleep, wake_up, collective_rpc)

    def install_drop(self, llm):
        """The ``--drop`` fault on this engine's model (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
        model = common.engine_model(llm)
        original, drop, rec = model.load_weights, self.args.drop, self
        rec.dropped = 0

        def load_weights(weights, *a, **kw):
            def kept():
                for name, w in weights:
                    if drop in name:
                        rec.dropped += 1
                        continue
                    yield name, w
            return original(kept(), *a, **kw)

        model.load_weights = load_weights

    def install_trl(self):
        try:
            from trl.generation import vllm_generation
        except ImportError:  # TRL < 0.28: the push lives in the trainer
            return
        cls = vllm_generation.VLLMGeneration
        orig = cls.sync_weights
        rec = self

        def sync_weights(self, *a, **kw):
            t = time.perf_counter()
            out = orig(self, *a, **kw)
            rec.pushes.append({"step": rec.step(), "s": time.perf_counter() - t})
            return out

        cls.sync_weights = sync_weights

    def step(self):
        return self.trainer.state.global_step if self.trainer is not None else None

    def observe(self, llm):
        import torch

        trainer = self.trainer
        if trainer is None:
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        trainer_params = dict(model.named_parameters())
        engine = common.engine_named_params(llm)
        if self.checkpoint is None:
            dev = next(iter(engine.values())).device
            self.checkpoint = common.load_checkpoint(self.args.model, device=str(dev))
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        vs_trainer = common.compare_weights(engine, trainer_params)
        vs_ckpt = common.compare_weights(engine, self.checkpoint)
        dtype = next(iter(engine.values())).dtype
        self.generates.append({
            "step": trainer.state.global_step,
            "engine_eq_trainer": vs_trainer["equal"], "max_abs_diff_trainer": vs_trainer["max_abs_diff"],
            "engine_eq_checkpoint": vs_ckpt["equal"],
            "unmatched": vs_trainer["unmatched"],
            "checksum_engine": common.checksum(engine.values()),
            "checksum_trainer": common.checksum(p.to(dtype) for p in trainer_params.values()),
            "checksum_checkpoint": common.checksum(self.checkpoint.values()),
        })


def _free():
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            return torch.cuda.mem_get_info()[0]
    except Exception:
        pass
    return None


def _pool_usage():
    try:
        from vllm.device_allocator.cumem import CuMemAllocator

        return CuMemAllocator.get_instance().get_current_usage()
    except Exception:
        return None


def summarize(rec: Recorder, trainer, args, t_start) -> dict:
    import trl

    keep = ("step", "loss", "reward", "reward_std", "grad_norm", "entropy")
    metrics = [{k: v for k, v in h.items() if (k in keep or k.startswith("sampling/")) and isinstance(v, (int, float))}
               for h in trainer.state.log_history if "step" in h and "train_runtime" not in h]
    verify = None
    if "shim.verify.weights" in sys.modules:  # SHIM_VERIFY_WEIGHTS: the shim's own verdicts and its time per check
        counts = sys.modules["shim.verify.weights"].counts()
        times = counts.pop("times")
        verify = {**counts, "mode": os.environ.get("SHIM_VERIFY_WEIGHTS", ""), "checks": len(times),
                  "first_s": times[0] if times else None, "times_s": times[:200],
                  "median_s": sorted(times)[len(times) // 2] if times else None,
                  "median_after_first_s": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else None}
    decisions = {}
    if "shim" in sys.modules:
        from shim.engine import registry

        decisions = {k: d.text() for k, d in registry.decisions().items()}
    gens = rec.generates
    trained = [g for g in gens if g["step"] > 0]
    steady = rec.step_times[1:] if len(rec.step_times) > 1 else rec.step_times

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    by_kind: dict = {}
    for e in rec.sleeps:
        key = f"sleep_l{e['level']}" if e["op"] == "sleep" else "wake_" + ("+".join(e["tags"]) if e["tags"] else "all")
        by_kind.setdefault(key, []).append(e["s"])
    return {
        "label": args.label, "trl": trl.__version__, "sleep": args.sleep, "shim": args.shim,
        "model": common.model_info(args.model), "steps": args.steps, "lr": args.lr,
        "engine_init": rec.engine_init,
        "decisions": decisions,
        "verify": verify,
        "generates": gens,
        "rollouts": len(gens),
        "generate_calls": rec.generate_calls,
        "rollouts_on_trainer_weights": sum(1 for g in gens if g["engine_eq_trainer"]),
        "rollouts_on_checkpoint_after_training": sum(1 for g in trained if g["engine_eq_checkpoint"]),
        "pushes": len(rec.pushes), "push_s": [p["s"] for p in rec.pushes],
        "reload_weights_calls": rec.reloads,
        "sleep_wake": rec.sleeps,
        "sleep_wake_mean_s": {k: mean(v) for k, v in sorted(by_kind.items())},
        "step_s": rec.step_times, "step_s_mean_after_first": mean(steady),
        "step_s_median_after_first": sorted(steady)[len(steady) // 2] if steady else None,
        "metrics": metrics,
        "logp_diff": [m.get("sampling/sampling_logp_difference/mean") for m in metrics],
        "wall_s": time.time() - t_start,
        "env": common.env_info(),
        "lora": args.lora, "drop": args.drop, "dropped_tensors": rec.dropped,
        "base_changed_elements": _base_changed(trainer, args.model) if args.lora else None,
    }


def _base_changed(trainer, model_dir) -> int:
    """Elements of the LoRA model's frozen base (``base_layer`` and untargeted weights) that differ from the
    checkpoint, bit for bit (bf16)."""
    base = {}
    model = trainer.accelerator.unwrap_model(trainer.model)
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        base[name.replace("base_model.model.", "").replace(".base_layer", "")] = param.detach()
    ckpt = common.load_checkpoint(model_dir, device=str(next(iter(base.values())).device))
    changed = 0
    for name, tensor in base.items():
        if name in ckpt:
            changed += int((tensor.to(ckpt[name].dtype) != ckpt[name]).sum())
    return changed


def main(argv=None) -> int:
    args = parse(argv)
    t_start = time.time()
    common.distributed_env()
    os.environ.setdefault("WANDB_DISABLED", "true")
    if args.trace:
        os.environ["SHIM_TRACE"] = args.trace
    if args.shim == "on":
        import shim.auto  # noqa: F401  (before TRL, as a user would)

    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from vllm.entrypoints.llm import LLM

    reason = common.Gate(args.after, label=args.label, shared=bool(args.barrier)).wait(common.deadline(), args.need_s)
    if reason:
        common.write_json(args.out, {"label": args.label, "skipped": reason})
        print(f"[grpo_run {args.label}] {reason}", flush=True)
        return 0
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
    if args.barrier:
        folder, name, n = args.barrier.rsplit(":", 2)
        common.barrier(folder, name, int(n))
    t_gpu = time.time()

    rec = Recorder(args)
    rec.install_llm(LLM)
    rec.install_trl()

    prompts = [f"{i} + {i % 7} =" for i in range(64)]
    ds = Dataset.from_dict({"prompt": prompts})

    def reward_len(completions, **kwargs):
        return [-abs(len(c) - 8) / 8.0 for c in completions]

    cfg = trl.GRPOConfig(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(args.out)), f"trainer-{os.getpid()}"),
        per_device_train_batch_size=args.batch, num_generations=args.gens, max_completion_length=args.completion,
        max_steps=args.steps, learning_rate=args.lr, logging_steps=1, save_strategy="no", report_to=[],
        bf16=cuda, use_cpu=not cuda, seed=0,
        use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=args.sleep == "on",
        vllm_gpu_memory_utilization=args.gpu_util, vllm_max_model_length=256,
    )

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            rec.step_times.append(time.perf_counter() - self.t)

    extra, model = {}, args.model
    if args.lora:
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM

        extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                          target_modules=["q_proj", "v_proj"])
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward_len, args=cfg, train_dataset=ds,
                              callbacks=[Timer()], **extra)
    rec.trainer = trainer
    trainer.train()
    summary = summarize(rec, trainer, args, t_start)
    summary["gpu_s"] = time.time() - t_gpu
    del trainer
    rec.trainer = None
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    common.write_json(args.out, summary)
    print(f"[grpo_run {args.label}] trl {summary['trl']} sleep={args.sleep} shim={args.shim}: "
          f"{summary['rollouts_on_trainer_weights']}/{summary['rollouts']} rollouts on the trainer's weights, "
          f"logp diff {summary['logp_diff']}, step {summary['step_s_mean_after_first']} s", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
