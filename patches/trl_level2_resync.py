"""TRL 0.25-0.27 GRPO/RLOO generate from discarded or initial weights after a level-2 sleep.

Upstream: huggingface/trl, no issue filed (the code moved to VLLMGeneration in 0.28.0, which has #5312)
Affects:  trl >=0.25.0,<0.28.0 GRPOTrainer and RLOOTrainer with vllm_mode="colocate",
          vllm_enable_sleep_mode=True
Remove:   when the shim's minimum supported trl is >=0.28.0

``_generate_single_turn`` wakes the weights after a ``sleep(level=2)`` and pushes the trained weights only when
``global_step != _last_loaded_step``: a second generation in the same step (tool-call loop, evaluation then
training, several generation batches per step) samples from discarded memory (0.25.x) or from the checkpoint
on disk that ``collective_rpc("reload_weights")`` brought back (0.26-0.27).
"""
from shim.engine.patch import Patch
from shim.trl.colocate import binding


def _site(class_name):
    """The fields that name the trainer class: its binding and summary."""
    probe, apply = binding(class_name, "_generate_single_turn")
    return dict(probe=probe, apply=apply,
                summary=f"{class_name}: trained weights pushed before every generate after a level-2 sleep; "
                        "no reload_weights from disk")


GRPO = Patch(id="trl-grpo-level2-resync", issue="trl 0.25-0.27 level-2 gap", distribution="trl",
             affected=">=0.25.0,<0.28.0", module="trl.trainer.grpo_trainer", tested_at=("trl", "0.27.2"),
             changes=("`GRPOTrainer`: the wrappers of `trl-stale-weights` (`shim.trl.colocate`) around "
                      "`_generate_single_turn` / `_move_model_to_vllm`: the trained weights are pushed before any "
                      "generate after a level-2 sleep, even within one step; no `reload_weights` from disk"),
             verified=("CPU: real TRL 0.25.1 (discarded weights without the shim) and 0.26.2/0.27.2 (initial "
                       "checkpoint without the shim); the OpenEnv helper from a `rollout_func` on 0.27.2: initial "
                       "checkpoint without the shim (asserted), trained weights with it"),
             **_site("GRPOTrainer"))
RLOO = GRPO.like(id="trl-rloo-level2-resync", module="trl.trainer.rloo_trainer", **_site("RLOOTrainer"),
                 changes="`RLOOTrainer`: as `trl-grpo-level2-resync`",
                 verified=("CPU: real TRL 0.25.1/0.26.2/0.27.2 `RLOOTrainer` on the vLLM stand-in (and 1.9.2 "
                           "through `trl-stale-weights`)"))

PATCHES = [GRPO, RLOO]
