"""TRL GOLD (0.25-0.29) generates with its vLLM weights asleep after a level-2 sleep.

Upstream: huggingface/trl, no issue filed (found by reading the code; the test runs it); GOLD moved to
          VLLMGeneration in 1.0.0 (then covered by trl-stale-weights up to 1.9.2)
Affects:  trl >=0.25.0,<1.0.0 experimental GOLDTrainer with vllm_mode="colocate", vllm_enable_sleep_mode=True
Remove:   when the shim's minimum supported trl is >=1.0.0

GOLD keeps its own ``self.vllm_engine``, sleeps it at level 2 after init and after every generation, and before
generating wakes only the ``kv_cache`` tag; the weights are woken (and pushed) only by the step-end sync
callback. An on-policy generation before the first sync, or between syncs (gradient accumulation,
``vllm_sync_frequency > 1``), runs with the weights unmapped: an illegal memory access on CUDA.
"""
from shim.engine.patch import Patch
from shim.trl.colocate import binding, gold_colocate_sleep

_probe, _apply = binding("GOLDTrainer", "_generate_on_policy_outputs_vllm", predicate=gold_colocate_sleep,
                         llm_attr="vllm_engine")

PATCH = Patch(
    id="trl-gold-weights-asleep",
    tested_at=("trl", "0.29.1"),
    issue="trl GOLD weights asleep",
    distribution="trl",
    affected=">=0.25.0,<1.0.0",
    module="trl.experimental.gold.gold_trainer",
    apply=_apply,
    probe=_probe,
    summary="GOLDTrainer: weights woken and pushed before every generate after a level-2 sleep",
    verified=("CPU: real TRL 0.27.2 and 0.29.1 `GOLDTrainer`: illegal memory access without the shim (asserted), "
              "trained weights at every generate with it"),
    changes=("GOLD wakes only `kv_cache` before generating after a level-2 sleep: the shim wakes and pushes the "
             "trained weights first (and skips its `reload_weights` from disk). Bound through `shim.trl.colocate`: "
             "the trainer's `_move_model_to_vllm` runs (weights woken first) before every generate whose weights "
             "are asleep or discarded; the `reload_weights` it skips would be followed right away by the push."),
)

PATCHES = [PATCH]
