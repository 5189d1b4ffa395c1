"""The shim's figures in the trainer's logged metrics (``shim/...``), and the stale-rollout alarm.

Upstream: none (a feature). Asked for in huggingface/trl#5312 (a stale-weights detector built by hand on
          ``sampling/sampling_logp_difference/mean``), vllm#52689 and verl#6666 (prove a weight sync landed),
          vllm-ascend#12073 (prove a sleep freed memory)
Affects:  transformers >=4.38.0 (``Trainer.log(logs, start_time)``): TRL's trainers and ms-swift's; ms-swift's
          weight pushes counted in ms-swift >=3.10.0,<4.0.0 and >=4.0.0 (3.2.1-3.9.x not counted)
Remove:   never (a feature); the alarm when trainers check their own weight syncs

One wrapper on the base ``Trainer.log``, not a ``TrainerCallback``: ``Trainer.log`` appends to ``log_history``
before it calls ``on_log`` (read in transformers 4.57.6), so a callback cannot add to what is recorded.
Stands down where ``Trainer.log`` has no ``logs`` parameter.
"""
from shim.engine.patch import FEATURE, Patch
from shim.engine.probes import changed, params

ID = "trainer-metrics"


def _probe(module):
    log = getattr(getattr(module, "Trainer", None), "log", None)
    if log is None:
        return changed("transformers.trainer.Trainer.log not found")
    names, reason = params(log, "Trainer.log")
    if reason:
        return reason
    if names[1:2] != ["logs"]:
        return changed(f"Trainer.log{tuple(names)} has no 'logs' first argument")
    return None


def _apply(module, patcher):
    from shim.observe import trainer_metrics

    patcher.wrap(module.Trainer, "log", trainer_metrics.wrap_log)


PATCH = Patch(
    id=ID,
    kind=FEATURE,
    tested_at=("vllm", "0.24.0"),  # transformers.trainer from tests/requirements.txt (4.57.6)
    issue="trainer metrics (shim/ keys, stale-rollout alarm)",
    distribution="transformers",
    affected=">=4.38.0",
    module="transformers.trainer",
    apply=_apply,
    probe=_probe,
    summary="shim/ figures (sleeps, ineffective sleeps, GiB freed per sleep, weight pushes, verified/stale "
            "rollouts) in the trainer's logged metrics; stale-rollout alarm on the trainer's logp difference",
    verified=("CPU: real TRL 1.9.2 `GRPOTrainer` on the stand-in: `shim/` keys at every step of `log_history`; "
              "with `trl-stale-weights` disabled TRL's logp difference is 1.5-1.9 and the alarm fires once "
              "(asserted), with the shim whole it stays ~0 and silent; none without the shim. Real transformers "
              "4.57.6 `Trainer`: callbacks see the keys, eval logs untouched, an error never stops the log"),
    changes=("`Trainer.log`: adds the `shim/` figures to the logs before they are recorded and feeds the "
             "stale-rollout alarm (`shim.observe.trainer_metrics.wrap_log`): the `shim/` keys reach "
             "`state.log_history`, the console, wandb, tensorboard and ms-swift's `logging.jsonl`; every trainer "
             "whose `log` reaches `transformers.trainer.Trainer.log` (TRL's GRPO, RLOO, OnlineDPO, GOLD, ...; "
             "ms-swift's)."),
)

def _probe_swift(module):
    cls = getattr(module, "RolloutTrainerMixin", None)
    if not callable(getattr(cls, "_move_model_to_vllm", None)):
        return changed("RolloutTrainerMixin._move_model_to_vllm not found")
    return None


def _apply_swift(module, patcher):
    from shim.observe import trainer_metrics

    patcher.wrap(module.RolloutTrainerMixin, "_move_model_to_vllm", trainer_metrics.count_push)


SWIFT = Patch(
    id="trainer-metrics-swift",
    kind=FEATURE,
    tested_at=("swift", "3.10.1"),
    issue="trainer metrics (shim/ keys, stale-rollout alarm)",
    distribution="ms-swift",
    affected=">=3.10.0,<4.0.0",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=_apply_swift,
    probe=_probe_swift,
    summary="shim/weight_pushes for ms-swift: each RolloutTrainerMixin._move_model_to_vllm that returned",
    changes=("`RolloutTrainerMixin._move_model_to_vllm`: each push that returned counts in `shim/weight_pushes` "
             "(ms-swift pushes the weights itself, through no path of the shim's); 3.2.1-3.9.x not counted"),
    verified=("CPU: real ms-swift 3.10.1 and 4.6.0 level-2 rollouts on the stand-in: the count equals the pushes "
              "the trainer made (counted outside the shim)"),
)
SWIFT_4X = SWIFT.like(id="trainer-metrics-swift-4x", affected=">=4.0.0", module="swift.rlhf_trainers.rollout_mixin",
                      tested_at=("swift", "4.6.0"))

PATCHES = [PATCH, SWIFT, SWIFT_4X]
