"""Real TRL ``VLLMGeneration`` (colocate) on the vLLM stand-in: one weight push between two
rollouts that reuse the same image and prompt; prints a JSON summary as its last line.

    python tests/scenarios/trl_vlm_run.py --model DIR [--shim on|off] [--sleep on|off] [--inflight]
        [--trainer generation|online_dpo]

Drives the real class the trainers hold (``trainer.vllm_generation``): ``generate`` (prompt token
ids + one image), a training update of the model's parameters, ``sync_weights`` (TRL's own push),
``generate`` again. ``--inflight`` leaves one request in flight at the push (an async rollout,
or a request an exception left behind): its KV blocks make ``reset_prefix_cache()`` fail.
Observation: the stand-in's ``generate`` event of the second rollout (``stale_encoder_hits``:
images served with embeddings computed by other weights; ``stale_prefix_hits``: prompts whose
cached prefix was computed by other weights; ``weights_fp`` vs the trainer's parameters).

``--trainer online_dpo``: the real experimental ``OnlineDPOTrainer`` instead (its own colocated
``llm``): ``_generate_vllm_colocate(prompts, images)`` twice, with a training update and a step
between, so its own push (``_move_model_to_vllm``, which resets only the prefix cache) runs at
the second call -- the push that only the shim's push path (``shim.trl.colocate``) follows with
the encoder reset.
"""
import argparse
import json
import os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--shim", choices=("on", "off"), default="off")
    p.add_argument("--sleep", choices=("on", "off"), default="off")
    p.add_argument("--inflight", action="store_true")
    p.add_argument("--trainer", choices=("generation", "online_dpo"), default="generation")
    a = p.parse_args()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if a.shim == "on":
        import shim.auto  # noqa: F401
    import torch
    import vllm
    from accelerate import Accelerator
    from PIL import Image
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    image = Image.new("RGB", (8, 8), (10, 20, 30))
    if a.trainer == "online_dpo":
        return online_dpo(a, tok, image)
    from trl.generation.vllm_generation import VLLMGeneration

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    gen = VLLMGeneration(model, Accelerator(cpu=True), tok, mode="colocate", enable_sleep_mode=a.sleep == "on",
                         gpu_memory_utilization=0.3, max_completion_length=3, temperature=1.0)
    prompt = tok("describe the image")["input_ids"]
    gen.generate([prompt], [[image]], 1)
    with torch.no_grad():  # one training update
        for param in model.parameters():
            param.add_(0.05)
    if a.inflight:
        gen.llm.llm_engine.add_request("in-flight", {"prompt_token_ids": [5, 6, 7]},
                                       vllm.SamplingParams(max_tokens=1))

    gen.sync_weights()
    gen.generate([prompt], [[image]], 1)
    summary(model)


def online_dpo(a, tok, image):
    import tempfile

    import torch
    from datasets import Dataset
    from trl.experimental.online_dpo.online_dpo_trainer import OnlineDPOConfig, OnlineDPOTrainer

    cfg = OnlineDPOConfig(output_dir=tempfile.mkdtemp(prefix="online-dpo-"), max_steps=2,
                          per_device_train_batch_size=2, max_new_tokens=3, report_to="none", use_vllm=True,
                          vllm_mode="colocate", vllm_enable_sleep_mode=a.sleep == "on",
                          vllm_gpu_memory_utilization=0.3, use_cpu=True, save_strategy="no", bf16=False, seed=0)
    trainer = OnlineDPOTrainer(model=a.model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                               args=cfg, train_dataset=Dataset.from_dict({"prompt": ["describe the image"] * 4}),
                               processing_class=tok)
    trainer._generate_vllm_colocate(["describe the image"], [image])
    with torch.no_grad():  # one training update, then the next step
        for param in trainer.model.parameters():
            param.add_(0.05)
    trainer.state.global_step += 1
    trainer._generate_vllm_colocate(["describe the image"], [image])
    summary(trainer.model)


def summary(model):
    import vllm

    last = [e for e in vllm._fake.EVENTS if e["event"] == "generate"][-1]
    resets = [e for e in vllm._fake.EVENTS if e["event"] == "reset_prefix_cache"]
    print(json.dumps({
        "stale_encoder_hits": last["stale_encoder_hits"], "encoder_hits": last["encoder_hits"],
        "stale_prefix_hits": last["stale_prefix_hits"],
        "trained_weights": last["weights_fp"] == vllm._fake.fingerprint(model.named_parameters()),
        "prefix_resets": [e.get("ok") for e in resets],
        "encoder_resets": sum(1 for e in vllm._fake.EVENTS if e["event"] == "reset_encoder_cache"),
    }))


if __name__ == "__main__":
    main()
