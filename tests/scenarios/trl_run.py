"""One real TRL training run on the vLLM stand-in; prints a JSON summary as its last line.

    python tests/scenarios/trl_run.py --trainer grpo|rloo|online_dpo|gold --out DIR
        [--shim before|after|off] [--sleep on|off] [--steps 3] [--ga 2] [--spg 1] [--lr 0.05]
        [--rollout default|openenv] [--skip-push NAME] [--lora [--lora-bias]] [--images] [--model qwen2|mla]
        [--final-compare]

Run with a TRL release, tests/fakevllm and the repository on PYTHONPATH (tests
do this through ``tests.support.trl_support.run_trl``). ``--shim before`` imports
``shim.auto`` before TRL, ``after`` after TRL's trainer module, ``off`` not at
all.

Observation (test-side instrumentation of the stand-in, not of TRL): at every
real ``LLM.generate``/``LLM.chat`` it compares the engine's weights with the
trainer model's current parameters and with the initial checkpoint, through
the stand-in's fingerprints; with ``--model mla`` (a tiny DeepSeek-V2) also whether each MLA
layer's derived ``W_UK_T`` / ``W_UV`` are the ones its current ``kv_b_proj`` gives (``derived``) and
lie in the weights pool (``derived_in_pool``). ``--final-compare``: after training, the trainer's own
push method writes the final weights, and the engine's greedy completions are compared with those of
a fresh engine (no sleep mode) loaded from the trainer's saved weights (``final``). ``--images``: every
prompt sent to ``LLM.generate`` carries the same image (a vision-language rollout's shape), so it goes
through the stand-in's encoder cache; the summary counts the images served with an encoder output of
other weights (``stale_encoder_hits``), the cache hits and the engine's ``reset_encoder_cache`` calls.

``--lora`` (GRPO/RLOO): the trainer model is loaded in bfloat16 and TRL wraps it in a PEFT LoRA
(``peft_config``: rank 4 on ``q_proj``, ``v_proj`` and ``embed_tokens``, so ``lora.Linear`` and
``lora.Embedding`` layers; ``init_lora_weights=False``, so every push, the first one too, carries
a real delta). At every generate the observation also records, through
``tests.support.lora_check``: how many elements of the frozen base tensors differ (bytes) from
the trainer's model right after TRL built it (``base_changed``), how many engine elements are
further than one bfloat16 rounding from the trainer's base plus adapter merged out of place
(``beyond``), and per LoRA layer class how many elements the adapter moves (``effect``). ``--lora-bias``:
``LoraConfig(lora_bias=True)`` on ``q_proj``/``v_proj`` only (PEFT has no LoRA bias for embeddings); the
reference adds ``lora_B.bias * scaling`` to each base bias, and the observation also records how many
elements of the base biases differ from the start (``bias_changed``) and how many the LoRA bias moves
(``bias_effect``).
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
    p.add_argument("--lora", action="store_true", help="bf16 model wrapped by TRL in a PEFT LoRA (peft_config)")
    p.add_argument("--lora-bias", action="store_true",
                   help="with --lora: LoraConfig(lora_bias=True) on q_proj/v_proj only (PEFT has no LoRA bias for "
                        "embeddings)")
    p.add_argument("--images", action="store_true",
                   help="every prompt the trainer sends to LLM.generate carries one image (the same one), as a "
                        "vision-language rollout's do: it goes through the stand-in's encoder cache")
    p.add_argument("--model", choices=("qwen2", "mla"), default="qwen2")
    p.add_argument("--final-compare", action="store_true")
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
        (tiny.make_tiny_mla_model if a.model == "mla" else tiny.make_tiny_model)(model_dir)
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
        extra = {}
        if a.lora:  # as GRPO/RLOO below
            import torch
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                              target_modules=["q_proj", "v_proj", "embed_tokens"])
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16) if a.lora else model_dir
        trainer = mod.OnlineDPOTrainer(model=model, reward_funcs=reward_len, args=cfg, train_dataset=ds,
                                       processing_class=tok, **extra)
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
        if a.lora:
            import torch
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM

            targets = ["q_proj", "v_proj"] + ([] if a.lora_bias else ["embed_tokens"])
            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                              target_modules=targets, **({"lora_bias": True} if a.lora_bias else {}))
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        else:
            model = model_dir
        trainer = Trainer(model=model, reward_funcs=reward_len, args=cfg, train_dataset=ds, **extra)
    trainer_box["t"] = trainer

    checkpoint_fp = next(e["weights_fp"] for e in EVENTS if e["event"] == "load_model")
    observed = []
    if a.lora:
        from tests.support import lora_check

        base_before = lora_check.base_snapshot(trainer.model)
    observing = [True]

    def observe(method):
        original = getattr(LLM, method)

        def instrumented(self, *args, **kwargs):
            if not observing[0]:
                return original(self, *args, **kwargs)
            engine_model = self.llm_engine.model_executor.driver_worker.model_runner.model
            engine_fp = fingerprint(engine_model.named_parameters())
            trainer_fp = fingerprint(trainer_box["t"].model.named_parameters())
            observed.append({"step": trainer_box["t"].state.global_step, "engine": engine_fp,
                             "trainer": trainer_fp, "checkpoint": engine_fp == checkpoint_fp,
                             **derived_state(self.llm_engine.model_executor.driver_worker.model_runner)})
            if a.lora:
                import torch

                model = trainer_box["t"].model
                observed[-1].update(
                    base_changed=lora_check.changed_elements(model, base_before),
                    beyond=lora_check.beyond_one_rounding(dict(engine_model.named_parameters()),
                                                          lora_check.reference(model), torch.bfloat16),
                    effect=lora_check.adapter_effect(model, torch.bfloat16))
                if a.lora_bias:
                    observed[-1].update(
                        bias_changed=lora_check.changed_elements(
                            model, {n: t for n, t in base_before.items() if n.endswith("base_layer.bias")}),
                        bias_effect=lora_check.bias_effect(model, torch.bfloat16))
            return original(self, *args, **kwargs)

        setattr(LLM, method, instrumented)

    if a.skip_push:
        from vllm.v1.worker.gpu_model_runner import VllmModelMixin  # the stand-in model's load_weights

        push = VllmModelMixin.load_weights

        def partial_push(self, weights):
            return push(self, [(n, w) for n, w in weights if n != a.skip_push])

        VllmModelMixin.load_weights = partial_push
    def derived_state(runner):
        """MLA: derived matrices == what the current kv_b_proj gives; their storage in the weights pool."""
        import torch

        layers = getattr(runner, "mla_layers", [])
        if not layers:
            return {}
        pool = {a.ptr for a in vllm._fake.device.DEVICE.allocations.values() if a.pool is not None}
        holders = [layer.impl if layer.impl is not None else layer for layer in layers]
        return {"derived": all(torch.equal(layer.absorbed_weight(), layer.kv_b_proj.weight) for layer in layers),
                "derived_in_pool": all(h.W_UV.untyped_storage().data_ptr() in pool for h in holders)}

    observe("generate")
    if a.images:
        from PIL import Image

        image = Image.new("RGB", (8, 8), (10, 20, 30))
        plain_generate = LLM.generate

        def with_image(self, prompts, *args, **kwargs):
            items = prompts if isinstance(prompts, (list, tuple)) else [prompts]
            items = [{**(p if isinstance(p, dict) else {"prompt": p}), "multi_modal_data": {"image": image}}
                     for p in items]
            return plain_generate(self, items, *args, **kwargs)

        LLM.generate = with_image
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

    observing[0] = False  # the final comparison's generates are not the training's
    final = final_compare(trainer, model_dir, a.out) if a.final_compare else None
    from shim.engine import registry

    metrics = [{k: v for k, v in h.items() if k.startswith(("sampling/", "shim/")) or k in ("step", "reward", "loss")}
               for h in trainer.state.log_history]
    pushes = sum(1 for e in EVENTS if e["event"] == "load_weights")
    # every weights wake: are the woken weights the ones the engine held when it went to sleep?
    held, weights_wakes = None, []
    for e in EVENTS:
        if e["event"] in ("load_model", "generate", "chat") or (e["event"] == "load_weights" and not e.get("lost")):
            held = e.get("weights_fp") or held
        elif e["event"] == "worker_wake_up" and (e.get("tags") is None or "weights" in e["tags"]):
            weights_wakes.append(e["weights_fp"] == held)
            held = e["weights_fp"]
    summary = {
        "trl": trl.__version__, "vllm": vllm.__version__, "generates": observed,
        "mismatches": sum(1 for o in observed if o["engine"] != o["trainer"]),
        "from_checkpoint_after_training": sum(1 for o in observed if o["checkpoint"] and o["trainer"] != checkpoint_fp),
        "load_weights_events": pushes,
        "sleep_levels": [e["level"] for e in EVENTS if e["event"] == "sleep"],
        "weights_wakes_kept": weights_wakes,
        "reloads": sum(1 for e in EVENTS if e["event"] == "reload_weights"),
        "lost_writes": sum(1 for e in EVENTS if e["event"] == "load_weights" and e.get("lost")),
        "guard_warnings": sum(1 for e in EVENTS if e["event"] == "executor_guard"),
        "stale_encoder_hits": sum(e.get("stale_encoder_hits", 0) for e in EVENTS if e["event"] == "generate"),
        "encoder_hits": sum(e.get("encoder_hits", 0) for e in EVENTS if e["event"] == "generate"),
        "encoder_resets": sum(1 for e in EVENTS if e["event"] == "reset_encoder_cache"),
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
        "final": final,
    }
    print(json.dumps(summary))


def final_compare(trainer, model_dir, out):
    """The trainer's own push of its final weights, then the engine's greedy completions against a fresh
    engine's (no sleep mode) loaded from the trainer's weights saved to disk."""
    import shutil

    from vllm import LLM, SamplingParams

    gen = getattr(trainer, "vllm_generation", None)
    owner = gen if gen is not None else trainer
    llm = owner.llm
    executor = llm.llm_engine.model_executor
    if "weights" in (getattr(executor, "sleeping_tags", None) or ()):
        llm.wake_up(tags=["weights"])
    (gen.sync_weights if gen is not None else trainer._move_model_to_vllm)()
    if "kv_cache" in (getattr(executor, "sleeping_tags", None) or ()):
        llm.wake_up(tags=["kv_cache"])
    prompts = [{"prompt_token_ids": ids} for ids in ([3, 10, 11, 12], [5, 6, 7], [20, 21, 22, 23, 24])]
    sp = SamplingParams(max_tokens=8, temperature=0.0)

    def greedy(engine):
        return [list(o.outputs[0].token_ids) for o in engine.generate(prompts, sp, use_tqdm=False)]

    engine_out = greedy(llm)
    fresh_dir = os.path.join(out, "final")
    trainer.model.save_pretrained(fresh_dir, safe_serialization=True)
    for f in os.listdir(model_dir):
        if f.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(model_dir, f), fresh_dir)
    fresh = LLM(model=fresh_dir, enable_sleep_mode=False, gpu_memory_utilization=0.3,
                distributed_executor_backend="external_launcher", seed=0)
    fresh_out = greedy(fresh)
    return {"engine": engine_out, "fresh": fresh_out, "equal": engine_out == fresh_out}


if __name__ == "__main__":
    main()
