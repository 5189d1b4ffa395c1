# The shim's trainer-metrics hook on a real transformers Trainer (test_metrics.py run_trainer): two logs after
# one sleep, what log_history and a callback got, printed as JSON. BREAK=1: the shim's totals raise.
import json
import os
import tempfile

import shim.auto  # noqa: F401  (before transformers: the shim's hook on the Trainer)
from shim.observe import events

# isort: split
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)
    def forward(self, x=None, labels=None):
        return {"loss": self.w(x).pow(2).mean()}

seen = []
class Watch(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kw):
        seen.append(dict(logs))
        logs["callback/added"] = 1.0  # what a callback can do: too late for log_history

args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True)
trainer = Trainer(model=Tiny(), args=args, callbacks=[Watch()])
events.emit("init", "LLMEngine#1", 0.1, taken=2 << 30, tracked=2 << 30, asleep=[])
events.emit("sleep", "LLMEngine#1", 0.1, level=1, tracked=2 << 30, freed=2 << 30, effective=True, asleep=["weights"])
events.count("verified_rollouts", 3)
if os.environ.get("BREAK") == "1":
    events.totals = lambda: 1 / 0
R = {}
try:
    trainer.log({"loss": 1.0, "sampling/sampling_logp_difference/mean": 0.5})
    trainer.log({"eval_loss": 2.0})
except ZeroDivisionError as e:
    R["raised"] = repr(e)
R["history"] = trainer.state.log_history
R["seen"] = seen
print(json.dumps(R))
