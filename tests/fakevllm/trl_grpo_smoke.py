"""Smoke run of a REAL trl.GRPOTrainer (colocate + vllm_enable_sleep_mode) on the fake, CPU, 3 steps.

    PYTHONPATH=<trl install>:tests/fakevllm python tests/fakevllm/trl_grpo_smoke.py MODEL_DIR OUT_DIR

Prints the EVENTS (which weights each generate used vs the trainer weights at each step end) and
the sampling/* metrics.  Not collected by pytest (name does not start with test_)."""
import json
import os
import socket
import sys

os.environ.setdefault("RANK", "0"); os.environ.setdefault("LOCAL_RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
if "MASTER_PORT" not in os.environ:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1]); s.close()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tiny
import trl
import vllm
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from vllm._fake import EVENTS, fingerprint

model_dir = sys.argv[1]
out = sys.argv[2]
if not os.path.exists(os.path.join(model_dir, "config.json")):
    tiny.make_tiny_model(model_dir)
ds = Dataset.from_dict({"prompt": ["the cat is", "one plus two equals", "the sky is", "hello world", "red blue", "big dog"] * 4})

def reward_len(completions, **kw):
    return [float(len(c)) / 10.0 for c in completions]

cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                 max_steps=3, learning_rate=float(os.environ.get("LR", "0.05")), logging_steps=1, report_to="none",
                 use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=0.3,
                 use_cpu=True, save_strategy="no", bf16=False, seed=0)
trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=cfg, train_dataset=ds)
fps_by_step = {}
from transformers import TrainerCallback


class CB(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kw):
        EVENTS.append({"event": "trainer_step_end", "step": state.global_step,
                       "weights_fp": fingerprint(trainer.model.named_parameters())})
trainer.add_callback(CB())
trainer.train()
ck = [e for e in EVENTS if e["event"] == "load_model"][0]["weights_fp"]
print("TRL", trl.__version__, "vllm", vllm.__version__, "checkpoint_fp", ck)
for e in EVENTS:
    if e["event"] in ("generate", "chat", "load_weights", "reload_weights", "sleep", "wake_up", "executor_guard", "trainer_step_end"):
        print("EV", json.dumps({k: e.get(k) for k in ("seq", "event", "step", "level", "tags", "weights_fp", "is_checkpoint", "weights_origin", "n_tensors", "lost", "note", "stale_prefix_hits") if e.get(k) is not None}))
for h in trainer.state.log_history:
    print("LOG", {k: v for k, v in h.items() if "sampling" in k or k in ("step", "loss", "reward")})
