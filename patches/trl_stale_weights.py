"""TRL rollouts use the initial checkpoint under vLLM sleep mode.

Upstream: huggingface/trl#5312 (bug), fixed by #5313 in 1.10.0; #5142 (push into unmapped memory, 0.28.x)
Affects:  trl >=0.28.0,<1.10.0 with vllm_mode="colocate", vllm_enable_sleep_mode=True
Remove:   when the shim's minimum supported trl is >=1.10.0

``VLLMGeneration.generate`` wakes the weights and calls ``collective_rpc("reload_weights")`` after the
trainer's ``sync_weights`` pushed the trained weights, so every rollout samples from the checkpoint on disk.
"""
from shim.engine.patch import Patch
from shim.engine.probes import fixed_if_contains
from shim.trl.colocate import binding, generation_colocate_sleep

_probe_shape, _apply = binding("VLLMGeneration", "generate", "sync_weights", generation_colocate_sleep)


def probe(module):
    return _probe_shape(module) or fixed_if_contains(module.VLLMGeneration, "VLLMGeneration", "_llm_weights_sleeping",
                                                     "fixed upstream (VLLMGeneration has _llm_weights_sleeping)")


PATCH = Patch(
    id="trl-stale-weights",
    tested_at=("trl", "1.9.2"),
    issue="huggingface/trl#5312",
    distribution="trl",
    affected=">=0.28.0,<1.10.0",
    fixed_in="1.10.0",
    module="trl.generation.vllm_generation",
    apply=_apply,
    probe=probe,
    summary="colocate+sleep: trained weights pushed before generate instead of reload_weights from disk; "
            "weights woken before sync_weights writes them",
    verified=("CPU: real TRL 0.28.0, 0.29.0, 0.29.1, 1.0.0, 1.9.2 `GRPOTrainer` on the vLLM stand-in, CUDA and NPU "
              "modes: without the shim rollouts use the initial checkpoint (asserted), with it every rollout uses "
              "the trainer's current weights; 1.10.0 and 1.16.0 unchanged; TRL's logp difference on 1.9.2 equals "
              "the sleep-off run. The OpenEnv helper `trl.experimental.openenv.utils.generate_rollout_completions` "
              "(own wake + `reload_weights`, 0.26-1.8) from a real GRPO `rollout_func`: 1.0.0 faults on the second "
              "rollout of a step without the shim (asserted), trained weights with it"),
    changes=("`VLLMGeneration` (GRPO, RLOO; GOLD and distillation from 1.0): no `reload_weights` from disk inside "
             "`generate`; the trained weights are pushed before a generate whenever the engine's weights are "
             "asleep or were discarded (the semantics of the 1.10.0 fix, same number of pushes); `sync_weights` "
             "wakes the weights before writing them (0.28.x wrote into unmapped memory); backends without "
             "`reload_weights` (vllm-ascend < 0.24.0rc1) are never asked for it. Stands down on 1.10.0+ (`stand "
             "down: fixed upstream in 1.10.0`). Bound through `shim.trl.colocate`: the colocated `llm` sits behind "
             "`shim.trl.synced_llm`, so the reload never reads the disk; a push whenever the engine's weights are "
             "asleep or were discarded by the level-2 sleep is the semantics of the upstream "
             "`_llm_weights_sleeping` flag."),
)

PATCHES = [PATCH]
