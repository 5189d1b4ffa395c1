"""ms-swift's set_expandable_segments is CUDA-only, reads one env var and overwrites it whole.

Upstream: modelscope/ms-swift#6636 (first sleep frees 0.00 GiB on Ascend: the helper never looks at
          PYTORCH_NPU_ALLOC_CONF); the helper as of 4.6.0 (`swift/rlhf_trainers/utils.py`)
Affects:  ms-swift >=3.10.0,<4.0.0 (swift-expandable-segments) and >=4.0.0 (-4x, -megatron, -ray):
          colocate rollouts with --sleep_level > 0 (every release with the helper)
Remove:   when ms-swift's helper covers every route and keeps the user's string

``set_expandable_segments(enable)`` (rollout ``utils``) decides once, at
import, whether to act: only if ``PYTORCH_CUDA_ALLOC_CONF`` contains
"expandable_segments" -- even ``expandable_segments:False``, which it then
turns ON after building the engine and after every rollout. It acts only when
CUDA is available, and sets ``PYTORCH_CUDA_ALLOC_CONF`` to
``expandable_segments:<enable>``, dropping the user's other keys
(``max_split_size_mb``, ...). It never looks at ``PYTORCH_NPU_ALLOC_CONF``,
``PYTORCH_ALLOC_CONF`` or ``PYTORCH_HIP_ALLOC_CONF``. The rollout mixins import
it BY NAME, and 4.x's ``sleep_vllm_engine`` calls it through ``utils``: the
shim rebinds the name in the rollout mixin (and, for 4.x, in ``utils``) to
``shim.vllm.sleep.alloc_guard``: ``False`` suspends expandable segments on every route
and the live setting, ``True`` puts back exactly what the user had. On CUDA with
vLLM 0.33+ both leave every route alone (``alloc_guard.upstream_covers``: vLLM turns
expandable segments off around its pool itself and keeps the user's other options),
so the user's string is never overwritten there either.

4.x has two more by-name importers of the helper (same shape, same binding):

- ``swift.megatron.trainers.rollout_mixin`` (``MegatronRolloutMixin``, Megatron
  GRPO/GKD): ``_init_rollout_engine`` brackets the engine build and first sleep
  with ``(False)``/``(True)``; ``_generate_completions`` calls ``(False)`` before
  waking the KV cache, and ``utils.sleep_vllm_engine`` ``(True)`` after the
  sleep. Level 2, read in 4.6.0: ``needs_weight_sync = self._step !=
  self._last_loaded_step or self.args.sleep_level == 2``, so every rollout after
  a level-2 sleep wakes the weights and pushes the trained ones before the KV
  cache wakes, also several rollouts within one step; ``_move_model_to_vllm``
  forces the full push at level 2 with LoRA too (``base_sync_done`` is not
  trusted there). Correct: no level-2 patch for the Megatron mixin.
- ``swift.ray.megatron.rollout.ray_vllm_engine`` (``RayVllmEngine``, the Ray
  rollout actor): ``wake_up`` calls ``(False)`` before a wake that includes
  ``kv_cache``, ``sleep`` calls ``(True)`` after the sleep (its first sleep
  has no ``(False)`` before it: ``alloc_guard.resume`` is then a no-op). It does
  not bracket the engine build at all; ``vllm-sleep-guard`` covers that, in the
  actor's process, when the shim reaches it (``python -m shim`` / ``install``).
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
    verified="CPU: real ms-swift 3.10.1/4.6.0 rollouts on the stand-in",
    tested_at=("swift", "3.10.1"),
)
V4 = V3.like(id="swift-expandable-segments-4x", affected=">=4.0.0", module="swift.rlhf_trainers.rollout_mixin",
             apply=_apply("swift.rlhf_trainers.utils"), tested_at=("swift", "4.6.0"))
# Megatron (4.x): the same by-name import in the Megatron rollout mixin and the Ray rollout engine.
V4_MEGATRON = V4.like(id="swift-expandable-segments-megatron", module="swift.megatron.trainers.rollout_mixin",
                      tested_at=("swift-megatron", "4.6.0"))
V4_RAY = V4.like(id="swift-expandable-segments-ray", module="swift.ray.megatron.rollout.ray_vllm_engine",
                 tested_at=("swift-megatron", "4.6.0"))

PATCHES = [V3, V4, V4_MEGATRON, V4_RAY]
