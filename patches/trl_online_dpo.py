"""TRL experimental OnlineDPO generates from discarded weights with gradient accumulation > 1.

Upstream: huggingface/trl, no issue filed (found by reading the code; see the test for the proof)
Affects:  trl >=0.28.0 (every release with OnlineDPO sleep mode, up to 1.16.0 at least)
          with vllm_mode="colocate", vllm_enable_sleep_mode=True, gradient_accumulation_steps > 1
Remove:   when upstream pushes the weights after every level-2 sleep

``OnlineDPOTrainer._generate_vllm_colocate`` runs once per micro-batch: it wakes the weights, pushes them only
when ``global_step`` changed, generates, and sleeps at level 2, which discards the weights: micro-batches 2..N
of a step generate from undefined memory.
"""
from shim.engine.patch import Patch
from shim.trl.colocate import binding

_probe, _apply = binding("OnlineDPOTrainer", "_generate_vllm_colocate")

PATCH = Patch(
    id="trl-online-dpo-resync",
    tested_at=("trl", "1.9.2"),
    issue="trl OnlineDPO level-2 gap",
    distribution="trl",
    affected=">=0.28.0",
    module="trl.experimental.online_dpo.online_dpo_trainer",
    apply=_apply,
    probe=_probe,
    summary="OnlineDPOTrainer: trained weights pushed before every generate after a level-2 sleep",
    verified=("CPU: real TRL 0.28.0/1.9.2/1.16.0 `OnlineDPOTrainer`, GA=2: garbage weights without the shim "
              "(asserted), trained weights with it"),
    changes=("`_generate_vllm_colocate` runs per micro-batch but pushes only when `global_step` changed, after a "
             "level-2 sleep: the shim pushes the trained weights before every generate whose weights were "
             "discarded. Bound through `shim.trl.colocate`: `_move_model_to_vllm` runs before every generate whose "
             "weights were discarded."),
)

PATCHES = [PATCH]
