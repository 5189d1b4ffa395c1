"""MLA (DeepSeek-V2) after a TRL-style weight push, on real vLLM 0.24: derived matrices and greedy output.

    python bench/gpu_mla_push.py [--quant bf16 fp8kv] [--modes off tensors on] [--cudagraphs]
        [--workdir /tmp/shim-gpu/mla] [--out bench/results/gpu_mla_push.json]

(``--out`` is merged into: the runs of an earlier call with other ``--quant`` / ``--modes`` stay.)

Issue 19 items 1 and 2 on the real engine (the CPU tests run the same on tests/fakevllm). A tiny
random DeepSeek-V2 checkpoint (2 layers, 2 heads, DeepSeek's MLA sizes: kv_lora_rank 512,
qk_nope 128, qk_rope 64, v 128; dense MLPs, so no MoE kernel runs) is made locally. One child
process per (quantization, mode) builds a colocated engine as TRL does (``external_launcher``,
``enable_sleep_mode=True``, ``attention_backend="TRITON_MLA"``; the prefill runs on FlashAttention 3)
and runs, with ``push`` = TRL's colocated push, one ``model.load_weights([(name, tensor)])`` per
tensor (``VLLMGeneration.sync_weights``):

    step 0  sleep(2), wake weights, push the CHECKPOINT weights, wake kv_cache  (TRL 1.x's first rollout)
    step 1  push "trained" weights (checkpoint + noise)
    step 2  sleep(2), wake weights, push the trained weights, wake kv_cache

After each step: greedy completions of 3 prompts and every MLA layer's ``W_UK_T`` / ``W_UV``, compared
with a fresh engine (no sleep mode, own process) loaded from those weights on disk. Modes: ``off``
(no shim), ``tensors`` (shim on, the push raw: only ``vllm-level2-tensors`` acts, as with
``trl-push-reprocess`` disabled), ``on`` (shim on, the push inside ``shim.vllm.weights.reload.session``: what
``trl-push-reprocess`` wraps around TRL's push). Quantizations: ``bf16`` (none) and ``fp8kv``
(online fp8 per tensor on ``kv_b_proj`` only; the other linears ignored; ``kv_b_proj`` is square
here, 2 x (128 + 128) = 512 = kv_lora_rank, so a raw push does not stop on the transposed fp8 shape).

Expected (from the 0.24.0 code, to be confirmed here, see :func:`expected`): ``bf16``: ``W_UV`` /
``W_UK_T`` are views of ``kv_b_proj.weight`` (``get_and_maybe_dequant_weights`` returns the weight
itself), so every mode matches the fresh engine; ``fp8kv``: they are their own dequantized copies in
the weights pool -- ``off`` differs at every step (step 0: the level-2 sleep discarded them; the raw
push also writes checkpoint-format bf16 into the fp8 ``kv_b_proj``), ``tensors`` has the matrices
back at step 0 (restored by the sleep wrapper) and stale after the push of step 1, ``on`` matches at
every step and the session keeps each ``W_UV`` at its address (``data_ptr`` unchanged: the sleep pool,
the CUDA graphs).

Needs the offline bundle with FlashAttention 3 kept (../shared/gpu/README.md: ``KEEP=
"vllm_flash_attn/_vllm_fa3_C.abi3.so"``); run from the repository root (the shim is imported from
there). Exit status 0 when every expectation above holds. ``ALLOW_FAKE=1 PYTHONPATH=tests/fakevllm`` runs the
script on the CPU stand-in (to debug it; the stand-in's fp8 is the derivation only, see its README). About 8 engine starts (~30 s each with
``enforce_eager``; ``--cudagraphs`` captures graphs instead, slower).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PROMPTS = ([3, 10, 11, 12], [5, 6, 7], [20, 21, 22, 23, 24])
MAX_TOKENS = 12
HEADS, KV_LORA_RANK, NOPE, ROPE, V = 2, 512, 128, 64, 128


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quant", nargs="*", default=["bf16", "fp8kv"], choices=["bf16", "fp8kv"])
    p.add_argument("--modes", nargs="*", default=["off", "tensors", "on"], choices=["off", "tensors", "on"])
    p.add_argument("--cudagraphs", action="store_true", help="capture CUDA graphs (default: enforce_eager)")
    p.add_argument("--workdir", default="/tmp/shim-gpu/mla")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "gpu_mla_push.json"))
    p.add_argument("--role", default="driver", choices=["driver", "main", "fresh"])
    p.add_argument("--mode", default="off")
    p.add_argument("--q", default="bf16")
    p.add_argument("--model", default="")
    p.add_argument("--result", default="")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--trl-path", action="append", default=[], help="ignored (tests/gpu/results.py passes it): no TRL here")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------
def make_checkpoint(path: str, seed: int = 0, noise_from: str = "", noise: float = 0.0) -> str:
    """A random bf16 DeepseekV2ForCausalLM (+ tests/tiny.py's tokenizer); with ``noise_from``, that
    checkpoint's weights plus Gaussian noise (the "trained" weights)."""
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV2ForCausalLM, GenerationConfig

    from tests import tiny

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(path, exist_ok=True)
    tok = tiny.make_tokenizer()
    tok.save_pretrained(path)
    if noise_from:
        model = AutoModelForCausalLM.from_pretrained(noise_from, dtype=torch.bfloat16)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in model.named_parameters():
                p.add_((torch.randn(p.shape, generator=g) * noise * (p.float().std() + 1e-3)).to(p.dtype))
    else:
        vocab = (len(tok) + 63) // 64 * 64
        cfg = DeepseekV2Config(
            vocab_size=vocab, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=None,
            kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V,
            first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            max_position_embeddings=1024, tie_word_embeddings=False, attention_bias=False,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
        torch.manual_seed(seed)
        model = DeepseekV2ForCausalLM(cfg).to(torch.bfloat16)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.05)
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    return path


def hf_weights(path: str) -> list:
    """The checkpoint's tensors under their checkpoint names, on the GPU (what TRL pushes)."""
    import glob

    import torch
    from safetensors.torch import load_file

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the dry run on tests/fakevllm
    out = []
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        out += [(n, t.to(device, torch.bfloat16)) for n, t in load_file(f).items()]
    return out


# ---------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------
def engine_kwargs(quant: str, cudagraphs: bool, sleep: bool) -> dict:
    kw = dict(dtype="bfloat16", max_model_len=256, gpu_memory_utilization=0.2, seed=0, enforce_eager=not cudagraphs,
              enable_sleep_mode=sleep, attention_backend="TRITON_MLA", distributed_executor_backend="external_launcher")
    if quant == "fp8kv":
        others = ["q_proj", "kv_a_proj_with_mqa", "o_proj", "gate_up_proj", "down_proj", "gate_proj", "up_proj"]
        kw.update(quantization="fp8_per_tensor",
                  quantization_config={"ignore": [f"re:.*\\.{name}$" for name in others]})
    return kw


def mla_layers(llm) -> list:
    from vllm.model_executor.layers.attention import MLAAttention

    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    return [m for m in model.modules() if isinstance(m, MLAAttention)]


def derived(llm) -> list:
    import torch

    return [{"W_UV": m.W_UV.detach().to("cpu", torch.float32).clone(),
             "W_UK_T": m.W_UK_T.detach().to("cpu", torch.float32).clone()} for m in mla_layers(llm)]


def greedy(llm) -> list:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], sp,
                                                               use_tqdm=False)]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launcher_env() -> None:
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", free_port())


def role_fresh(a) -> None:
    """A fresh engine (no sleep mode) loaded from ``--model``: greedy + derived matrices to ``--result``."""
    import torch
    from vllm import LLM

    launcher_env()
    llm = LLM(model=a.model, **engine_kwargs(a.q, a.cudagraphs, sleep=False))
    torch.save({"greedy": greedy(llm), "derived": derived(llm)}, a.result)


def role_main(a) -> None:
    """The engine under test, mode ``--mode``: the three steps of the module docstring to ``--result``."""
    import contextlib
    import logging

    import torch

    launcher_env()
    shim_lines = []
    if a.mode != "off":
        import shim.auto  # noqa: F401

        class Collect(logging.Handler):
            def emit(self, record):
                shim_lines.append(record.getMessage())

        logging.getLogger("shim").addHandler(Collect())
    from vllm import LLM

    ckpt, trained = a.model.split(",")
    llm = LLM(model=ckpt, **engine_kwargs(a.q, a.cudagraphs, sleep=True))
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    layers = mla_layers(llm)
    info = {"mla_layers": len(layers),
            "views_of_kv_b_proj": [m.W_UV.untyped_storage().data_ptr() == m.kv_b_proj.weight.untyped_storage().data_ptr()
                                   for m in layers],
            "kv_b_proj_dtype": str(layers[0].kv_b_proj.weight.dtype) if layers else None,
            "quant_method": type(getattr(layers[0].kv_b_proj, "quant_method", None)).__name__ if layers else None}
    ptrs0 = [m.W_UV.data_ptr() for m in layers]

    def push(path):
        session = contextlib.nullcontext()
        if a.mode == "on":
            from shim.vllm.weights import reload

            session = reload.session(llm)
        t0 = time.perf_counter()
        with session:
            for name, tensor in hf_weights(path):  # TRL: one raw load_weights per tensor
                model.load_weights([(name, tensor)])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    steps = {}
    before = greedy(llm)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    push(ckpt)
    llm.wake_up(tags=["kv_cache"])
    steps["0"] = {"greedy": greedy(llm), "derived": derived(llm), "before_sleep": before}
    push(trained)
    llm.reset_prefix_cache()
    steps["1"] = {"greedy": greedy(llm), "derived": derived(llm)}
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    push(trained)
    llm.wake_up(tags=["kv_cache"])
    steps["2"] = {"greedy": greedy(llm), "derived": derived(llm)}
    info["W_UV_address_kept"] = [m.W_UV.data_ptr() for m in mla_layers(llm)] == ptrs0
    info["shim_lines"] = [line for line in shim_lines if "sleep" in line or "plain" in line or "reload" in line]
    torch.save({"steps": steps, "info": info}, a.result)


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------
def child(a, role: str, **kw) -> dict:
    import torch

    args = [sys.executable, os.path.abspath(__file__), "--role", role, "--timeout", str(a.timeout)]
    for k, v in kw.items():
        args += [f"--{k}", str(v)]
    if a.cudagraphs:
        args.append("--cudagraphs")
    t0 = time.time()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=a.timeout, cwd=REPO)
    log = os.path.splitext(kw["result"])[0] + ".log"
    with open(log, "w") as f:
        f.write(proc.stdout + "\n---- stderr ----\n" + proc.stderr)
    print(f"[gpu_mla_push] {role} q={kw.get('q')} mode={kw.get('mode', '-')}: rc={proc.returncode} "
          f"{time.time() - t0:.0f} s (log {log})", flush=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    return torch.load(kw["result"], weights_only=False)


def same_derived(a_list, b_list) -> bool:
    import torch

    return len(a_list) == len(b_list) and all(
        torch.equal(x["W_UV"], y["W_UV"]) and torch.equal(x["W_UK_T"], y["W_UK_T"]) for x, y in zip(a_list, b_list))


def driver(a) -> int:
    from tests.gpu import common

    reason = None if os.environ.get("ALLOW_FAKE") == "1" else common.skip_reason()
    if reason:
        print(f"[gpu_mla_push] skipped: {reason}")
        return 0
    os.makedirs(a.workdir, exist_ok=True)
    ckpt = make_checkpoint(os.path.join(a.workdir, "ckpt"))
    trained = make_checkpoint(os.path.join(a.workdir, "trained"), seed=1, noise_from=ckpt, noise=0.5)
    result = {"env": common.env_info(), "cudagraphs": a.cudagraphs, "runs": {}, "checks": []}
    ok = True
    for q in a.quant:
        fresh = {name: child(a, "fresh", q=q, model=path, result=os.path.join(a.workdir, f"fresh-{q}-{name}.pt"))
                 for name, path in (("ckpt", ckpt), ("trained", trained))}
        for mode in a.modes:
            r = child(a, "main", q=q, mode=mode, model=f"{ckpt},{trained}",
                      result=os.path.join(a.workdir, f"main-{q}-{mode}.pt"))
            run = {"error": r.get("error")} if "error" in r else {"info": r["info"], "steps": {}}
            for step, ref in (("0", "ckpt"), ("1", "trained"), ("2", "trained")):
                if "error" in r or "error" in fresh[ref]:
                    continue
                s = r["steps"][step]
                run["steps"][step] = {"greedy_equal": s["greedy"] == fresh[ref]["greedy"],
                                      "derived_equal": same_derived(s["derived"], fresh[ref]["derived"]),
                                      "greedy": s["greedy"], "fresh": fresh[ref]["greedy"]}
            result["runs"][f"{q}/{mode}"] = run
            expect = expected(q, mode)
            got = {k: {"greedy": v["greedy_equal"], "derived": v["derived_equal"]} for k, v in run.get("steps", {}).items()}
            passed = "error" not in run and set(got) == set(expect) and all(
                want is None or got[step][what] == want for step, checks in expect.items() for what, want in checks.items())
            if q == "fp8kv" and mode == "on" and passed:
                passed = bool(run["info"].get("W_UV_address_kept"))
            if q == "bf16" and "info" in run:
                passed = passed and all(run["info"]["views_of_kv_b_proj"])
            if q == "fp8kv" and "info" in run:
                passed = passed and not any(run["info"]["views_of_kv_b_proj"])
            result["checks"].append({"run": f"{q}/{mode}", "expected": expect, "got": got, "pass": passed})
            print(f"[gpu_mla_push] {q}/{mode}: expected {expect} got {got}: {'PASS' if passed else 'FAIL'}", flush=True)
            ok = ok and passed
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    previous = common.read_json(a.out) or {}  # runs of another call (e.g. --quant bf16, then --quant fp8kv)
    runs = dict(previous.get("runs", {}), **result["runs"])
    checks = [c for c in previous.get("checks", []) if c["run"] not in result["runs"]] + result["checks"]
    with open(a.out, "w") as f:
        json.dump(dict(result, runs=runs, checks=checks), f, indent=1, default=str)
    print(f"[gpu_mla_push] {'PASS' if ok else 'FAIL'}; results in {a.out}")
    return 0 if ok else 1


def expected(q: str, mode: str) -> dict:
    """Step -> whether the engine's greedy output / derived matrices match the fresh engine's (None: not judged).

    fp8kv with a raw push: the push also writes the bf16 checkpoint tensor into the fp8 kernel-format
    ``kv_b_proj`` (transposed layout, old scale), so its greedy output differs whatever happens to the
    derived matrices; the ``tensors`` run is judged on the matrices the sleep wrapper restored."""
    both = {"greedy": True, "derived": True}
    if q == "bf16" or mode == "on":
        return {"0": both, "1": both, "2": both}
    wrong = {"greedy": False, "derived": False}
    if mode == "off":
        return {"0": wrong, "1": wrong, "2": wrong}
    return {"0": {"greedy": None, "derived": True}, "1": {"greedy": False, "derived": False},
            "2": {"greedy": False, "derived": False}}


def main(argv=None) -> int:
    a = parse(argv)
    if a.role == "fresh":
        role_fresh(a)
        return 0
    if a.role == "main":
        role_main(a)
        return 0
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
