"""TRL's colocated engine always sleeps at level 2: SHIM_SLEEP_LEVEL picks the level (a feature).

Upstream: none in TRL (hard-coded ``sleep(level=2)``); asked for where level 2 breaks: vllm-ascend#13012,
          #13352, #16725 (NPU MoE), NVIDIA-NeMo/RL#2523, verl#3355 (level 1 on NPU)
Affects:  trl >=0.28.0 (VLLMGeneration, 1.16.0 included) colocate with vllm_enable_sleep_mode=True, only
          with SHIM_SLEEP_LEVEL set; ms-swift's --sleep_level is never touched
Remove:   when TRL takes the sleep level as an argument

``VLLMGeneration`` sleeps its ``vllm.LLM`` at level 2 after construction and after every rollout, which loses
what level 2 cannot restore (NPU MoE layouts). Level 1 keeps the weights in host memory and restores them at
the wake; safe at either level: TRL >= 1.10 pushes the trainer's weights after every sleep, 0.28-1.9.2 push
through the shim (``trl-stale-weights``). Stands down with the switch unset.
"""
from shim.engine.patch import FEATURE, Patch

ID = "trl-sleep-level"


def probe(module):
    from shim.engine import config, probes

    # TRL imports vllm.LLM only where vLLM is installed: without it, a plain reason, not a shape change
    reason = probes.missing(module, ("VLLMGeneration", "LLM"), "trl.generation.vllm_generation", needs=("vllm",))
    if reason:
        return reason
    llm = module.LLM
    if not isinstance(llm, type) or not callable(getattr(llm, "sleep", None)):
        return probes.changed("trl.generation.vllm_generation.LLM is no class with a sleep method")
    source, reason = probes.source(getattr(module.VLLMGeneration, "_init_vllm", None), "VLLMGeneration._init_vllm")
    if source is None:
        return reason
    if "sleep(level=2)" not in source:
        return probes.changed("VLLMGeneration._init_vllm has no sleep(level=2)")
    if config.sleep_level() is not None:
        return None
    bad = config.problem(config.SHIM_SLEEP_LEVEL)
    return (f"{config.SHIM_SLEEP_LEVEL} has a bad value {bad.value!r} (TRL's own level)" if bad
            else f"{config.SHIM_SLEEP_LEVEL} is unset (TRL's own level)")


def apply(module, patcher):
    from shim.trl import sleep_level

    patcher.set(module, "LLM", sleep_level.engine_class(module.LLM, ID))


PATCH = Patch(
    id=ID,
    kind=FEATURE,
    switch="SHIM_SLEEP_LEVEL",
    tested_at=("trl", "1.16.0"),
    issue="SHIM_SLEEP_LEVEL",
    distribution="trl",
    affected=">=0.28.0",
    module="trl.generation.vllm_generation",
    apply=apply,
    probe=probe,
    summary="SHIM_SLEEP_LEVEL=1|2: every sleep of VLLMGeneration's colocated engine (hard-coded level 2) runs "
            "at that level; level 1 keeps the weights across the sleep",
    changes=("with `SHIM_SLEEP_LEVEL=1` or `2`, every sleep of `VLLMGeneration`'s colocated engine (TRL "
             "0.28.0-1.16.0 hard-code `sleep(level=2)` right after construction in `_init_vllm` and after every "
             "rollout in `generate`, read in each wheel) runs at that level: the module's name `LLM` is bound to a "
             "subclass of vLLM's `LLM` whose `sleep` applies it, so the construction-time sleep is covered and "
             "`isinstance` holds; the shim's TRL binding records the level really slept at (after level 1 the "
             "woken weights are valid: no push needed). Unset: stands down. ms-swift's `--sleep_level` is never "
             "touched (its engines are not built through that name)"),
    verified=("CPU: real TRL 1.16.0 and 1.9.2 `GRPOTrainer` on the stand-in: `SHIM_SLEEP_LEVEL=1` every sleep at "
              "level 1 and every weights wake brings back the weights slept with, rollouts on the trainer's "
              "weights, 1.9.2 (stale-weights fix on) pushes less; unset every sleep at level 2 and every woken "
              "weight discarded; a bad value is one line and the shim stays off; ms-swift 4.6.0 with its GRPO "
              "module (TRL 0.29.1's `VLLMGeneration` patched) still sleeps at `--sleep_level 2`"),
)

PATCHES = [PATCH]
