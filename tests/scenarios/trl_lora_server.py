"""TRL's server-mode weight push of a PEFT LoRA model; prints a JSON summary as its last line.

    python tests/scenarios/trl_lora_server.py --out DIR [--shim before|off] [--syncs 4] [--dora]

Run with a TRL release, tests/fakevllm and the repository on PYTHONPATH (tests do this through
``tests.support.trl_support.run_trl(..., script=...)``). A real ``GRPOTrainer`` is built in colocate
mode on the vLLM stand-in (so that building it needs no server), with ``peft_config`` a LoRA of rank
4 on ``q_proj``, ``v_proj`` and ``embed_tokens`` of a bfloat16 model, adapter weights initialised
non-zero (``init_lora_weights=False``: the push carries a real delta from the first sync; ``--dora``:
``use_dora=True``, a LoRA variant the shim leaves to upstream). What pushes (its ``VLLMGeneration``,
0.28+, or the trainer itself, 0.23-0.27) is then switched to server mode (``mode`` /
``vllm_mode``) with ``vllm_client`` a :class:`Server`, and its push (``sync_weights()`` /
``_move_model_to_vllm()``) is called ``--syncs`` times: TRL's own server-mode path (1.11+: the
metadata pass on the first sync, then the stream; before: ``update_named_param`` per tensor; then
``reset_prefix_cache``).

After each sync the summary records, through ``tests.support.lora_check``: the frozen base
elements whose bytes differ from the model TRL built (``base_changed``), the received elements
further than one bfloat16 rounding from the base plus adapter merged out of place (``beyond``),
and per LoRA layer class the elements the adapter moves (``effect``); ``shim_warnings``: the
shim's WARNING lines; ``left_behind``: attributes of their own the model, the client or the pusher
still have after the syncs that they had not before (a stand-in not taken out).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/ for tiny


class Server:
    """Stand-in for the vLLM server behind TRL's ``VLLMClient`` (``trl vllm-serve``, a GPU engine).

    ``update_named_params(metadata, named_params)`` mirrors the trainer-facing contract of TRL
    1.11+'s ``VLLMClient.update_named_params`` (``trl/generation/vllm_client.py``): the server is
    told ``(name, dtype, shape)`` of every tensor first, then the iterator is consumed once, in that
    order, and the server's workers receive each tensor (the NCCL receive needs the announced dtype
    and shape, so a tensor that differs is an error here as it is a hang or garbage there); what a
    worker receives is what its ``load_weights`` writes, kept here as a float32 copy by name.
    ``update_named_param(name, weights)`` mirrors the one-tensor call of TRL 0.23-1.10's client (the
    tensor announced with its dtype and shape, then broadcast). ``reset_prefix_cache()`` is counted."""

    def __init__(self):
        self.weights, self.resets, self.updates = {}, 0, 0

    def update_named_param(self, name, weights):
        import torch

        self.weights[name] = weights.detach().to(torch.float32, copy=True)

    def update_named_params(self, metadata, named_params):
        import torch

        announced = list(metadata)
        received = 0
        for (name, dtype, shape), (got_name, tensor) in zip(announced, named_params, strict=True):
            if (got_name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) != (name, dtype, shape):
                raise RuntimeError(f"server announced {(name, dtype, shape)}, received "
                                   f"{(got_name, tensor.dtype, list(tensor.shape))}")
            self.weights[name] = tensor.detach().to(torch.float32, copy=True)
            received += 1
        self.updates += 1

    def reset_prefix_cache(self):
        self.resets += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shim", choices=("before", "off"), default="off")
    p.add_argument("--syncs", type=int, default=4)
    p.add_argument("--dora", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)
    import logging

    warnings = []

    class Collect(logging.Handler):  # the shim's WARNING lines (its logger does not propagate)
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("shim").addHandler(Collect(logging.WARNING))
    if a.shim == "before":
        import shim.auto  # noqa: F401
    import tiny
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from tests.support import lora_check

    model_dir = os.path.join(a.out, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        tiny.make_tiny_model(model_dir)
    cfg = trl.GRPOConfig(output_dir=os.path.join(a.out, "run"), max_steps=1, report_to="none", use_vllm=True,
                         vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, use_cpu=True, save_strategy="no",
                         bf16=False, seed=0, per_device_train_batch_size=4, num_generations=4,
                         max_completion_length=8)
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, use_dora=a.dora,
                             target_modules=["q_proj", "v_proj", "embed_tokens"])
    trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16),
                              reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=cfg,
                              train_dataset=Dataset.from_dict({"prompt": ["the cat is"] * 8}),
                              peft_config=peft_config)
    model = trainer.model
    base_before = lora_check.base_snapshot(model)
    server = Server()
    gen = getattr(trainer, "vllm_generation", None)
    if gen is not None:  # 0.28+
        gen.mode, gen.vllm_client, push = "server", server, gen.sync_weights
    else:  # 0.23-0.27: the trainer pushes itself
        trainer.vllm_mode, trainer.vllm_client, push = "server", server, trainer._move_model_to_vllm
    owners = {"model": model, "client": server, "pusher": gen if gen is not None else trainer}
    before = {k: set(vars(o)) for k, o in owners.items()}
    syncs = []
    for _ in range(a.syncs):
        push()
        syncs.append({"base_changed": lora_check.changed_elements(model, base_before),
                      "beyond": None if a.dora else  # DoRA merges differently: no out-of-place reference here
                      lora_check.beyond_one_rounding(server.weights, lora_check.reference(model), torch.bfloat16),
                      "effect": None if a.dora else lora_check.adapter_effect(model, torch.bfloat16)})
    from shim.engine import registry

    print(json.dumps({"trl": trl.__version__, "syncs": syncs, "updates": server.updates, "resets": server.resets,
                      "received": len(server.weights), "shim_warnings": warnings,
                      "left_behind": {k: sorted(set(vars(o)) - before[k]) for k, o in owners.items()},
                      "decisions": {k: d.text() for k, d in registry.decisions().items()}}))


if __name__ == "__main__":
    main()
