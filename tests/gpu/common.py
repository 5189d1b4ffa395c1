"""Shared helpers of the real-GPU tests and benchmarks (tests/gpu, bench/gpu_*.py).

Nothing heavy is imported at module level: :func:`skip_reason` answers "can the
GPU suite run here?" without importing torch when vLLM is not installed, so
the suite is skipped in a second on CPU machines and in CI.

- :func:`skip_reason`: None where CUDA and the real vLLM are present, else why not.
- :func:`make_model`: a random Qwen2 checkpoint made locally (no hub): ``tiny``
  (head_dim 64, ~1 M parameters, for correctness) or ``wide`` (~1.1 B
  parameters, 2.1 GiB of bf16 weights, where memory and time are measured).
- :func:`engine_named_params` / :func:`compare_weights`: vLLM's parameters
  (fused ``qkv_proj`` / ``gate_up_proj``) against a Hugging Face state dict.
- :class:`Gate`: the order in which processes sharing one GPU may use it
  (markers in a folder): imports overlap, device work does not.
- :func:`env_info`: GPU, driver, torch, CUDA, vLLM, TRL, transformers versions, date.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "results"
GRPO_RUN = pathlib.Path(__file__).resolve().parent / "grpo_run.py"
RESULTS_ENV = "SHIM_GPU_RESULTS"   # folder with results JSON made by bench/gpu_*.py (tests read them)
DEADLINE_ENV = "SHIM_GPU_DEADLINE"  # epoch seconds: runs that cannot finish before it are skipped
GiB = float(1 << 30)

_skip: list = []


def test_skip_reason() -> "str | None":
    """For tests/gpu: None when ``SHIM_GPU_RESULTS`` names a results folder (the tests
    then only read JSON made on a GPU earlier) or when the suite can run here."""
    if os.environ.get(RESULTS_ENV):
        return None
    return skip_reason()


def skip_reason() -> "str | None":
    """None where the GPU suite can run (CUDA + real vLLM), else a one-line reason."""
    if _skip:
        return _skip[0]
    reason = None
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        reason = "vLLM is not installed (the GPU suite needs CUDA and real vLLM)"
    elif spec.origin and "fakevllm" in spec.origin.replace(os.sep, "/"):
        reason = "vllm here is the repository's CPU stand-in (tests/fakevllm), not real vLLM"
    elif importlib.util.find_spec("torch") is None:
        reason = "torch is not installed"
    else:
        try:
            import torch

            if not torch.cuda.is_available():
                reason = "no CUDA device (torch.cuda.is_available() is False)"
        except Exception as exc:  # a broken torch build
            reason = f"torch unusable: {type(exc).__name__}: {exc}"
    _skip.append(reason)
    return reason


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------
SIZES = {
    # head_dim 64 everywhere (what vLLM's Triton attention is exercised with); vocab padded to 64
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "wide": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=4),
    # ~3.3 B parameters, over 3x "wide": the verification cost on a bigger model (issue 30 item 6)
    "big": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=34, num_attention_heads=48,
                num_key_value_heads=8),
}


def make_model(path, size: str = "tiny", seed: int = 0, device: str | None = None) -> str:
    """Write a random bf16 Qwen2ForCausalLM + a local byte-level BPE tokenizer into ``path``.

    The tokenizer is tests/tiny.py's (trained offline on a fixed word list); the
    vocabulary is padded to a multiple of 64 so vLLM adds no padding rows and its
    parameters have the trainer's shapes. Embeddings are tied (as in small Qwen2
    releases). Reused when ``path`` already holds a model of that size."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = pathlib.Path(path)
    stamp = path / "shim_model.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("size") == size:
        return str(path)
    sys.path.insert(0, str(REPO))
    from tests import tiny

    path.mkdir(parents=True, exist_ok=True)
    tok = tiny.make_tokenizer()  # saved natively below: the machine's transformers reads it back
    tok.save_pretrained(str(path))
    vocab = (len(tok) + 63) // 64 * 64
    cfg = Qwen2Config(vocab_size=vocab, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      **SIZES[size])
    torch.manual_seed(seed)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device(dev):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(path), safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    stamp.write_text(json.dumps({"size": size, "params": n, "bytes_bf16": 2 * n, "seed": seed,
                                 "config": SIZES[size], "vocab": vocab}))
    del model
    return str(path)


def ensure_model(given: str, workdir, size: str) -> str:
    """``given`` as it is when it holds a model (made there when empty), else WORKDIR/<size>."""
    if given:
        if not (pathlib.Path(given) / "config.json").exists():
            make_model(given, size)
        return given
    return make_model(pathlib.Path(workdir) / size, size)


def model_info(path) -> dict:
    stamp = pathlib.Path(path) / "shim_model.json"
    return json.loads(stamp.read_text()) if stamp.exists() else {}


# ---------------------------------------------------------------------------
# weights: vLLM's engine against a Hugging Face model
# ---------------------------------------------------------------------------
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def engine_model(llm):
    """The model object inside a colocated (in-process) vLLM engine."""
    llm = getattr(llm, "__wrapped__", llm)
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def engine_named_params(llm) -> dict:
    return dict(engine_model(llm).named_parameters())


def _hf_for(name: str, hf: dict):
    """The Hugging Face tensor(s) that make vLLM parameter ``name`` (None when unknown)."""
    if name in hf:
        return hf[name]
    for fused, parts in STACKED.items():
        if f".{fused}." in name:
            pieces = [hf.get(name.replace(fused, p)) for p in parts]
            if all(p is not None for p in pieces):
                import torch

                return torch.cat([p.to(pieces[0].device) for p in pieces], dim=0)
    if name == "lm_head.weight" and "model.embed_tokens.weight" in hf:
        return hf["model.embed_tokens.weight"]
    return None


def checksum(tensors) -> float:
    """Sum of every element in float64: invariant to vLLM's fusing of q/k/v and gate/up."""
    import torch

    total = 0.0
    with torch.no_grad():
        for t in tensors:
            total += float(t.detach().to(torch.float64).sum())
    return total


def compare_weights(engine: dict, hf: dict) -> dict:
    """Compare vLLM's parameters with a HF state dict (cast to the engine's dtype).

    Returns ``{"equal": bool, "max_abs_diff": float, "tensors": n, "unmatched": [names]}``:
    ``equal`` means every engine tensor is bit-identical to the trainer's tensor
    rounded to the engine's dtype (what the weight push writes)."""
    import torch

    max_diff, unmatched, equal = 0.0, [], True
    with torch.no_grad():
        for name, p in engine.items():
            ref = _hf_for(name, hf)
            if ref is None or tuple(ref.shape) != tuple(p.shape):
                unmatched.append(name)
                equal = False
                continue
            ref = ref.detach().to(device=p.device, dtype=p.dtype)
            if not torch.equal(ref, p.data):
                equal = False
                max_diff = max(max_diff, float((ref.float() - p.data.float()).abs().max()))
    return {"equal": equal and not unmatched, "max_abs_diff": max_diff, "tensors": len(engine),
            "unmatched": unmatched[:5]}


def load_checkpoint(path, device="cuda") -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(pathlib.Path(path).glob("*.safetensors")):
        out.update(load_file(str(f), device=device))
    return out


# ---------------------------------------------------------------------------
# ordering processes on one GPU
# ---------------------------------------------------------------------------
class Gate:
    """Each process waits for the marker files in ``after`` before it touches the GPU, then takes the
    device lock (tests/gpu/devlock.py, where ``$SHIM_GPU_LOCK`` names one) for the rest of its life.

    Imports (tens of seconds for vLLM + TRL) overlap; device work runs in the
    order the markers give. The launcher writes a process's own marker when the
    process has exited (its memory and CUDA context are gone by then). The lock
    holds even where the markers leave a hole (issue 30: a phase left out of
    run_all.sh's chain let the next phase start beside the first): no process's
    device work overlaps another's sleep. ``shared``: processes meant to run
    together (a barrier after CUDA init) share it, still excluding everyone else."""

    def __init__(self, after=(), poll: float = 0.2, label: str = "", shared: bool = False):
        self.after = [pathlib.Path(a) for a in after if a]
        self.poll = poll
        self.label = label or f"{pathlib.Path(sys.argv[0]).name} {os.getpid()}"
        self.shared = shared

    def wait(self, deadline: "float | None" = None, need_s: float = 0.0) -> "str | None":
        """None when it is this process's turn (the lock taken); a reason when it must not run (deadline)."""
        while not all(a.exists() for a in self.after):
            if deadline and time.time() + need_s > deadline:
                return f"skipped: deadline (waiting for {[str(a.name) for a in self.after if not a.exists()]})"
            time.sleep(self.poll)
        if deadline and time.time() + need_s > deadline:
            return f"skipped: deadline ({need_s:.0f} s needed, {deadline - time.time():.0f} s left)"
        from tests.gpu import devlock

        return devlock.acquire(self.label, shared=self.shared, deadline=deadline, need_s=need_s, poll=self.poll)


SLEEP_OVERLAP = "Memory usage increased after sleeping"  # vLLM worker's assert on the device-wide mem_get_info


def sleep_overlap_crash(log_path) -> bool:
    """Did the run whose log this is die on vLLM's sleep assert (another process allocated on the device
    during its sleep)?"""
    try:
        return SLEEP_OVERLAP in pathlib.Path(log_path).read_text(errors="replace")
    except OSError:
        return False


def barrier(folder, name: str, count: int, timeout: float = 180.0) -> bool:
    """Wait until ``count`` processes reached ``name`` (True) or ``timeout`` passed (False)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.{os.getpid()}").touch()
    end = time.time() + timeout
    while len(list(folder.glob(f"{name}.*"))) < count:
        if time.time() > end:
            return False
        time.sleep(0.1)
    return True


def deadline() -> "float | None":
    value = os.environ.get(DEADLINE_ENV)
    return float(value) if value else None


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def distributed_env() -> None:
    """What vLLM's external_launcher (TRL/ms-swift colocate) reads, for one process."""
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", free_port())


# ---------------------------------------------------------------------------
# launching runs
# ---------------------------------------------------------------------------
def launch(script, args, log_path, env=None, pythonpath=()) -> subprocess.Popen:
    """Start ``python script args`` with the repository (and ``pythonpath``) first on PYTHONPATH."""
    environment = dict(os.environ)
    environment.update(env or {})
    parts = [*[str(p) for p in pythonpath], str(REPO)]
    if environment.get("PYTHONPATH"):
        parts.append(environment["PYTHONPATH"])
    environment["PYTHONPATH"] = os.pathsep.join(parts)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, str(script), *[str(a) for a in args]], env=environment,
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))


def finish(proc: subprocess.Popen, marker=None, timeout: "float | None" = None) -> int:
    """Wait for ``proc`` (killed after ``timeout``), then write its marker."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    if marker:
        pathlib.Path(marker).touch()
    return rc


def read_json(path) -> "dict | None":
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None


def tail(path, n: int = 15) -> str:
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def write_json(path, obj) -> str:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return str(path)


def publish(out, record: dict, results: dict, table_md: str, figures: dict, extra: str = "") -> int:
    """The end of every ``bench/gpu_*.py`` orchestrator: the record gets the environment of its
    runs (GPU, driver, versions, date; this process's if no run recorded one), is written to
    ``out`` as JSON, and printed: the table, ``extra``, one line per figure, each run's error."""
    env = next((r["env"] for r in results.values() if r.get("env")), None) or env_info()
    write_json(out, {"what": record.pop("what", ""), "env": env, **record})
    print(table_md + "\n")
    for k, v in figures.items():
        print(f"{k:55s} {round(v, 4) if isinstance(v, float) else v}")
    if extra:
        print("\n" + extra)
    for label, r in results.items():
        if r.get("error"):
            print(f"\n[{label}] {r['error']}")
    print(f"\nwrote {out}")
    return 0


# ---------------------------------------------------------------------------
# environment record
# ---------------------------------------------------------------------------
def _version(dist: str) -> "str | None":
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def env_info() -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "python": sys.version.split()[0]}
    for dist in ("torch", "vllm", "trl", "transformers", "accelerate", "triton", "datasets"):
        info[dist] = _version(dist)
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_total_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GiB, 1)
    except Exception as exc:
        info["torch_error"] = repr(exc)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            name, _, driver = out.stdout.strip().splitlines()[0].partition(",")
            info["driver"] = driver.strip()
            info.setdefault("gpu", name.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    info["shim_commit"] = _git_commit()
    return info


def _git_commit() -> "str | None":
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def allocator_settings() -> dict:
    """The user's allocator configuration as every route shows it (env strings + live)."""
    out = {v: os.environ.get(v) for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    try:
        import torch

        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        out["live"] = getter() if getter else None
    except Exception as exc:
        out["live"] = f"unreadable: {exc!r}"
    return out


def fmt_table(rows: list, columns: list) -> str:
    """A Markdown table (README-ready)."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)
