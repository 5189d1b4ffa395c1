"""Data, model and plugin folder for tests/gpu/verl_grpo.sh (verl 0.9.1 GRPO, issue 21 item 5).

usage: python3 tests/gpu/verl_grpo_data.py WORKDIR [--no-model]
writes WORKDIR/data/{train,val}.parquet (verl's RLHF schema: data_source, prompt as chat messages,
ability, reward_model.ground_truth, extra_info.index), WORKDIR/tiny (tests.gpu.common.make_model
"tiny": random bf16 Qwen2 ~1.3 M parameters + tests/tiny.py's tokenizer with its chat template),
WORKDIR/plug (verl_grpo_plugin.py, verl_grpo_reward.py, agent_loops.yaml registering ``seeded_single_turn``).
"""
import os
import pathlib
import random
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def prompts(n, seed):
    sys.path.insert(0, str(REPO))
    from tests import tiny
    rng = random.Random(seed)
    words = [w for w in tiny.WORDS if w not in ("user", "assistant", "system")]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 8))) for _ in range(n)]


def write(path, texts, split):
    import pandas as pd
    rows = [{"data_source": "shim_len", "prompt": [{"role": "user", "content": t}], "ability": "length",
             "reward_model": {"style": "rule", "ground_truth": "16"},
             "extra_info": {"index": i, "split": split}} for i, t in enumerate(texts)]
    pd.DataFrame(rows).to_parquet(path)


def main():
    work = pathlib.Path(sys.argv[1]); work.mkdir(parents=True, exist_ok=True)
    (work / "data").mkdir(exist_ok=True)
    write(work / "data" / "train.parquet", prompts(64, 1), "train")
    write(work / "data" / "val.parquet", prompts(8, 2), "val")
    plug = work / "plug"; plug.mkdir(exist_ok=True)
    for f in ("verl_grpo_plugin.py", "verl_grpo_reward.py"):
        shutil.copy(REPO / "tests" / "gpu" / f, plug / f)
    (plug / "agent_loops.yaml").write_text(
        "- name: seeded_single_turn\n  _target_: verl_grpo_plugin.SeededSingleTurnAgentLoop\n")
    if "--no-model" not in sys.argv:
        sys.path.insert(0, str(REPO))
        from tests.gpu.common import make_model
        print("model:", make_model(work / "tiny", "tiny", seed=0, device="cpu"))
    print("data:", sorted(os.listdir(work / "data")))


if __name__ == "__main__":
    main()
