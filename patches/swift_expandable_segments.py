"""ms-swift's set_expandable_segments is CUDA-only, reads one env var and overwrites it whole.

Upstream: modelscope/ms-swift#6636 (first sleep frees 0.00 GiB on Ascend: the helper never looks at
          PYTORCH_NPU_ALLOC_CONF); the helper as of 4.6.0 (`swift/rlhf_trainers/utils.py`)
Affects:  ms-swift >=3.10.0,<4.0.0 (swift-expandable-segments) and >=4.0.0 (-4x, -megatron, -ray):
          colocate rollouts with --sleep_level > 0 (every release with the helper)
Remove:   when ms-swift's helper covers every route and keeps the user's string

The rollout mixins (and 4.x's Megatron mixin and Ray engine) import the helper by name, so each of those names
is rebound to ``shim.vllm.alloc_guard``: ``False`` suspends expandable segments on every route, ``True`` puts
back exactly what the user had. What each site changes and how it was verified: the records (docs/patches.md).
"""
import sys

from shim.engine.patch import Patch
from shim.engine.probes import changed
from shim.swift.expandable_segments import set_expandable_segments


def probe(module):
    if not callable(getattr(module, "set_expandable_segments", None)):
        name = getattr(module, "__name__", "").rpartition(".")[2] or "rollout_mixin"
        return changed(f"{name}.set_expandable_segments not found")
    return None


def _apply(utils_module):
    """Rebind the rollout mixin's name, and ``utils_module``'s (4.x's ``sleep_vllm_engine`` calls it there)."""
    def apply(module, patcher):
        patcher.set(module, "set_expandable_segments", set_expandable_segments)
        utils = sys.modules.get(utils_module)
        if utils is not None and callable(getattr(utils, "set_expandable_segments", None)):
            patcher.set(utils, "set_expandable_segments", set_expandable_segments)

    return apply


V3 = Patch(
    id="swift-expandable-segments",
    issue="modelscope/ms-swift#6636",
    distribution="ms-swift",
    affected=">=3.10.0,<4.0.0",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=_apply("swift.trainers.rlhf_trainer.utils"),
    probe=probe,
    summary="rollout set_expandable_segments -> shim allocator guard (every route, NPU too, user's string kept)",
    tested_at=("swift", "3.10.1"),
    verified=("CPU: real ms-swift 3.10.1/4.6.0 rollouts: your string lost / flipped without the shim (asserted), "
              "kept with it"),
    changes=("the rollout mixin's `set_expandable_segments` (imported by name; 4.x also `utils`, used by "
             "`sleep_vllm_engine`) becomes the shim's allocator guard: every route (`PYTORCH_CUDA_ALLOC_CONF`, "
             "`PYTORCH_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`, `PYTORCH_NPU_ALLOC_CONF`, live setting), NPU too, "
             "and your exact string back afterwards. ms-swift's own is CUDA-only, rewrites the whole "
             "`PYTORCH_CUDA_ALLOC_CONF` (other keys lost) and turns an explicit `expandable_segments:False` ON "
             "Upstream's helper, read in the code: it decides once, at import, whether to act: only if "
             "`PYTORCH_CUDA_ALLOC_CONF` contains \"expandable_segments\" -- even `expandable_segments:False`, which "
             "it then turns ON after building the engine and after every rollout; it acts only when CUDA is "
             "available and sets `PYTORCH_CUDA_ALLOC_CONF` to `expandable_segments:<enable>`. On CUDA with vLLM "
             "0.33+ the guard leaves every route alone (`alloc_guard.upstream_covers`: vLLM turns expandable "
             "segments off around its pool itself and keeps the user's other options), so the user's string is "
             "never overwritten there either."),
)
V4 = V3.like(id="swift-expandable-segments-4x", affected=">=4.0.0", module="swift.rlhf_trainers.rollout_mixin",
             apply=_apply("swift.rlhf_trainers.utils"), tested_at=("swift", "4.6.0"))
# Megatron (4.x): the same by-name import in the Megatron rollout mixin and the Ray rollout engine.
V4_MEGATRON = V4.like(id="swift-expandable-segments-megatron", module="swift.megatron.trainers.rollout_mixin",
                      tested_at=("swift-megatron", "4.6.0"),
                      verified=("CPU: real ms-swift 4.6.0 with megatron-core 0.16.1 (mcore-bridge names stood in: "
                                "it needs Transformer Engine): your `PYTORCH_CUDA_ALLOC_CONF` keys lost and "
                                "`PYTORCH_NPU_ALLOC_CONF` left on without the shim (asserted), kept / turned off "
                                "with it; real `_init_rollout_engine` on the stand-in (NPU, `PYTORCH_ALLOC_CONF`): "
                                "first sleep frees ~0 without the shim (asserted), 100% with this patch alone"),
                      changes=("the same, for the other two 4.x modules that import `set_expandable_segments` by "
                               "name: `MegatronRolloutMixin` (`swift.megatron.trainers.rollout_mixin`: engine "
                               "build + first sleep, wake before each rollout) and `RayVllmEngine` "
                               "(`swift.ray.megatron.rollout.ray_vllm_engine`: `wake_up` / `sleep`). The Megatron "
                               "mixin's level-2 push (`needs_weight_sync ... or sleep_level == 2`) is correct in "
                               "4.6.0: no resync patch `MegatronRolloutMixin._init_rollout_engine` brackets the "
                               "engine build and first sleep with `(False)`/`(True)`; `_generate_completions` "
                               "calls `(False)` before waking the KV cache, and `utils.sleep_vllm_engine` `(True)` "
                               "after the sleep. Level 2, read in 4.6.0: `needs_weight_sync = self._step != "
                               "self._last_loaded_step or self.args.sleep_level == 2`, so every rollout after a "
                               "level-2 sleep wakes the weights and pushes the trained ones before the KV cache "
                               "wakes, also several rollouts within one step; `_move_model_to_vllm` forces the "
                               "full push at level 2 with LoRA too (`base_sync_done` is not trusted there). "
                               "`RayVllmEngine.wake_up` calls `(False)` before a wake that includes `kv_cache`, "
                               "its `sleep` `(True)` after the sleep (its first sleep has no `(False)` before it: "
                               "`alloc_guard.resume` is then a no-op); it does not bracket the engine build: "
                               "`vllm-sleep-guard` covers that, in the actor's process, when the shim reaches it "
                               "(`python -m shim` / `install`)."),)
V4_RAY = V4.like(id="swift-expandable-segments-ray", module="swift.ray.megatron.rollout.ray_vllm_engine",
                 tested_at=("swift-megatron", "4.6.0"),
                 changes=V4_MEGATRON.changes,
                 verified=V4_MEGATRON.verified)

PATCHES = [V3, V4, V4_MEGATRON, V4_RAY]
