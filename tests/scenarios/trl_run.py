"""One real TRL training run on the vLLM stand-in; prints a JSON summary as its last line.

    python tests/scenarios/trl_run.py --trainer grpo|rloo|online_dpo|gold --out DIR
        [--shim before|after|off] [--sleep on|off] [--steps 3] [--ga 2] [--spg 1] [--lr 0.05]
        [--rollout default|openenv] [--skip-push NAME]

Run with a TRL release, tests/fakevllm and the repository on PYTHONPATH (tests
do this through ``tests.support.trl_support.run_trl``). ``--shim before`` imports
``shim.auto`` before TRL, ``after`` after TRL's trainer module, ``off`` not at
all.

Observation (test-side instrumentation of the stand-in, not of TRL): at every
real ``LLM.generate``/``LLM.chat`` it compares the engine's weights with the
trainer model's current parameters and with the initial checkpoint, through
the stand-in's fingerprints.
"""
import argparse
import json
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/ for tiny


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", choices=("grpo", "rloo", "online_dpo", "gold"), default="grpo")
    p.add_argument("--shim", choices=("before", "after", "off"), default="off")
    p.add_argument("--sleep", choices=("on", "off"), default="on")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--ga", type=int, default=2)
    p.add_argument("--spg", type=int, default=1, help="steps_per_generation (GRPO/RLOO)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--rollout", choices=("default", "openenv"), default="default",
                   help="openenv: GRPO with a rollout_func that calls TRL's own "
                        "trl.experimental.openenv.utils.generate_rollout_completions (0.26-1.8)")
    p.add_argument("--skip-push", default="",
                   help="fault injection: every push into the engine (the stand-in model's load_weights) leaves "
                        "this tensor out, as a push that misses one tensor does (level 2 leaves it discarded)")
    p.add_argument("--drop-llm-chat", action="store_true",
                   help="an LLM without chat (a vLLM shape the verify-weights-vllm probe does not accept); "
                        "use with --shim after so the class is changed before the shim's hook sees it")
    p.add_argument("--out", required=True)
    return p.parse_args()


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main():
    a = parse()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", free_port())
    import logging

    shim_log = []  # the shim's log lines (its own "shim" logger), for the result

    class Collect(logging.Handler):
        def emit(self, record):
            shim_log.append([record.levelname, record.getMessage()])

    logging.getLogger("shim").addHandler(Collect(logging.INFO))
    if a.shim == "before":
        import shim.auto  # noqa: F401
    import tiny
    import trl
    import vllm
    from datasets import Dataset
    from transformers import AutoTokenizer
    from vllm._fake import EVENTS, fingerprint
    from vllm.entrypoints.llm import LLM

    module = {"grpo": "trl.trainer.grpo_trainer", "rloo": "trl.trainer.rloo_trainer",
              "online_dpo": "trl.experimental.online_dpo.online_dpo_trainer",
              "gold": "trl.experimental.gold.gold_trainer"}[a.trainer]
    mod = __import__(module, fromlist=["x"])
    if a.drop_llm_chat:
        del LLM.chat
    if a.shim == "after":
        import shim.auto  # noqa: F401,F811

    model_dir = os.path.join(a.out, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        tiny.make_tiny_model(model_dir)
    texts = ["the cat is", "one plus two equals", "the sky is", "hello world", "red blue green", "big dog"] * 8
    if a.trainer == "rloo":  # RLOO 0.26 handles plain-text prompts as messages: use conversational ones
        ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]})
    elif a.trainer == "gold":  # SFT-style conversations; lmbda=1: every step generates on-policy
        ds = Dataset.from_dict({"messages": [[{"role": "user", "content": t}, {"role": "assistant", "content": "yes"}]
                                             for t in texts]})
    else:
        ds = Dataset.from_dict({"prompt": texts})

    def reward_len(completions, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(len(t)) / 10.0 for t in texts]

    common = dict(output_dir=os.path.join(a.out, "run"), max_steps=a.steps, learning_rate=a.lr, logging_steps=1,
                  report_to="none", use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=a.sleep == "on",
                  vllm_gpu_memory_utilization=0.3, use_cpu=True, save_strategy="no", bf16=False, seed=0,
                  gradient_accumulation_steps=a.ga)
    trainer_box = {}
    if a.trainer == "gold":
        cfg = mod.GOLDConfig(per_device_train_batch_size=2, max_completion_length=8, teacher_model_name_or_path=model_dir,
                             lmbda=1.0, **common)
        tok = AutoTokenizer.from_pretrained(model_dir)
        trainer = mod.GOLDTrainer(model=model_dir, teacher_model=model_dir, args=cfg, train_dataset=ds,
                                  processing_class=tok)
    elif a.trainer == "online_dpo":
        cfg = mod.OnlineDPOConfig(per_device_train_batch_size=2, max_new_tokens=8, **common)
        tok = AutoTokenizer.from_pretrained(model_dir)
        trainer = mod.OnlineDPOTrainer(model=model_dir, reward_funcs=reward_len, args=cfg, train_dataset=ds,
                                       processing_class=tok)
    else:
        Config = trl.GRPOConfig if a.trainer == "grpo" else trl.RLOOConfig
        Trainer = trl.GRPOTrainer if a.trainer == "grpo" else trl.RLOOTrainer
        cfg = Config(per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                     steps_per_generation=a.spg, **common)
        extra = {}
        if a.rollout == "openenv":
            from trl.experimental.openenv.utils import generate_rollout_completions

            def rollout_func(prompts, trainer):  # the OpenEnv recipe's shape: TRL's helper, then the three keys
                results = generate_rollout_completions(trainer, prompts)
                return {k: [r[k] for r in results] for k in ("prompt_ids", "completion_ids", "logprobs")}

            extra["rollout_func"] = rollout_func
        trainer = Trainer(model=model_dir, reward_funcs=reward_len, args=cfg, train_dataset=ds, **extra)
    trainer_box["t"] = trainer

    checkpoint_fp = next(e["weights_fp"] for e in EVENTS if e["event"] == "load_model")
    observed = []

    def observe(method):
        original = getattr(LLM, method)

        def instrumented(self, *args, **kwargs):
            engine_model = self.llm_engine.model_executor.driver_worker.model_runner.model
            engine_fp = fingerprint(engine_model.named_parameters())
            trainer_fp = fingerprint(trainer_box["t"].model.named_parameters())
            observed.append({"step": trainer_box["t"].state.global_step, "engine": engine_fp,
                             "trainer": trainer_fp, "checkpoint": engine_fp == checkpoint_fp})
            return original(self, *args, **kwargs)

        setattr(LLM, method, instrumented)

    if a.skip_push:
        from vllm.v1.worker.gpu_model_runner import VllmModelMixin  # the stand-in model's load_weights

        push = VllmModelMixin.load_weights

        def partial_push(self, weights):
            return push(self, [(n, w) for n, w in weights if n != a.skip_push])

        VllmModelMixin.load_weights = partial_push
    observe("generate")
    if hasattr(LLM, "chat"):
        observe("chat")
    import logging

    warnings = []

    class Collect(logging.Handler):  # the shim's WARNING lines (its logger does not propagate)
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logging.getLogger("shim").addHandler(Collect())
    error = None
    try:
        trainer.train()
    except RuntimeError as exc:  # SHIM_STRICT + SHIM_VERIFY_WEIGHTS: the run stops; the summary says why
        if type(exc).__name__ != "StaleWeights":
            raise
        error = f"{type(exc).__name__}: {exc}"

    from shim.engine import registry

    metrics = [{k: v for k, v in h.items() if k.startswith(("sampling/", "shim/")) or k in ("step", "reward", "loss")}
               for h in trainer.state.log_history]
    pushes = sum(1 for e in EVENTS if e["event"] == "load_weights")
    summary = {
        "trl": trl.__version__, "vllm": vllm.__version__, "generates": observed,
        "mismatches": sum(1 for o in observed if o["engine"] != o["trainer"]),
        "from_checkpoint_after_training": sum(1 for o in observed if o["checkpoint"] and o["trainer"] != checkpoint_fp),
        "load_weights_events": pushes,
        "reloads": sum(1 for e in EVENTS if e["event"] == "reload_weights"),
        "lost_writes": sum(1 for e in EVENTS if e["event"] == "load_weights" and e.get("lost")),
        "guard_warnings": sum(1 for e in EVENTS if e["event"] == "executor_guard"),
        "decisions": {k: d.text() for k, d in registry.decisions().items()},
        "metrics": metrics,
        "shim_warnings": warnings,
        "error": error,
        "verify": ({k: v for k, v in sys.modules["shim.verify.weights"].counts().items() if k != "times"}
                   if "shim.verify.weights" in sys.modules else None),
        "shim_log": shim_log,
        "not_running": ({pid: sys.modules["shim.verify.weights"].not_running_reason(pid)
                         for pid in registry.decisions() if pid.startswith("verify-weights")}
                        if "shim.verify.weights" in sys.modules else None),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
