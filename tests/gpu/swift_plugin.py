"""ms-swift ``--external_plugins`` file of the GPU runs (bench/gpu_swift.py): a reward and the observation.

ms-swift imports this file while it parses its arguments (``BaseArguments._import_external_plugins``),
in the training process (each rank under torchrun), before it builds the models, the trainer or
vLLM. It adds:

- the reward ``shim_len`` (registered in ``swift.rewards.orms``): ``-|len(completion) - 8| / 8``,
  which varies between completions, so GRPO's advantages are not zero and training moves the
  weights (the same reward as tests/gpu/grpo_run.py for TRL);
- with ``SHIM_SWIFT_OBSERVE=PATH`` (rank 0 only), test-side instrumentation that is not the shim's
  and never changes what ms-swift does; the summary JSON is written to PATH when training ends:
  * right before every colocated rollout (``RolloutTrainerMixin._infer_single_or_multi_turn``, called
    by ``_fast_infer`` after the engine is awake and the weights were pushed), every parameter of the
    engine's model (``GRPOVllmEngine.inner_model``) is compared bit for bit with the trainer model's
    current parameter (tests.gpu.common.compare_weights: q/k/v and gate/up fused as vLLM does) and
    with the initial checkpoint. With LoRA the trainer's base weights are compared (``base_layer``
    names mapped; also the trainer's base against the checkpoint, ``trainer_base_drift``: ms-swift
    merges and unmerges the adapter into the frozen base at every adapter push, lossy in bf16), and the adapter: a float64 checksum of every ``lora_A`` tensor in the engine's
    registered LoRA model (vLLM's ``LoRAModel.loras[...].lora_a``; packing q/k/v does not change the
    sum) against the trainer's current ``lora_A`` parameters, and the last adapter ms-swift pushed
    (``add_lora``'s ``TensorLoRARequest.lora_tensors``) against the trainer's;
  * every worker sleep / wake (``vllm.v1.worker.gpu_worker.Worker.sleep`` / ``wake_up``: vLLM's own
    call, inside any wrapper of ms-swift or the shim): seconds, the device's free memory before and
    after (``torch.cuda.mem_get_info``) and the bytes vLLM's sleep pool tracked before the sleep
    (``CuMemAllocator.get_current_usage``): freed share = freed / tracked;
  * the allocator strings (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``) at every training step's
    start (what training runs with), at every rollout and at the end, against the user's string at start;
  * seconds per optimizer step (a ``TrainerCallback`` added in ``Trainer.train``), the trainer's log
    history (rewards, loss, ...), and for GKD every ``from_pretrained`` with whether transformers saw
    ZeRO-3 at that moment, and the ZeRO stage transformers sees when training starts (the student's
    config restored after the teacher's load).
- with ``SHIM_SWIFT_CPU_STANDIN=1`` (the CPU dry run only, tests/fakevllm as vLLM): ms-swift's
  ``get_torch_device()`` returns ``torch.cpu`` on a CPU-only torch, whose API lacks ``memory_reserved``;
  it is pointed at ``torch.cuda`` (whose memory functions the stand-in provides), as
  tests/scenarios/swift_run.py does.
"""
from __future__ import annotations

import atexit
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.append(_REPO)  # tests.gpu.common (after ms-swift's own paths)

from swift.rewards import ORM, orms  # noqa: E402

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class ShimLen(ORM):
    """Reward that varies with the completion's length (so the weights move)."""

    def __call__(self, completions, **kwargs):
        return [-abs(len(c) - 8) / 8.0 for c in completions]


orms["shim_len"] = ShimLen


def _alloc() -> dict:
    return {v: os.environ.get(v) for v in ALLOC_VARS}


class Observer:
    def __init__(self, path: str):
        self.path = path
        self.t0 = time.time()
        self.trainer = None
        self.checkpoint = None
        self.rollouts: list = []
        self.sleeps: list = []
        self.step_s: list = []
        self.alloc_at_step: list = []
        self.loads: list = []
        self.zero3_at_train_begin = None
        self.last_lora_push = None
        self.user_alloc = _alloc()
        self.written = False
        self.errors: list = []

    # -- helpers ---------------------------------------------------------------------------------
    def step(self):
        t = self.trainer
        return t.state.global_step if t is not None and getattr(t, "state", None) is not None else None

    def _err(self, where, exc):
        if len(self.errors) < 20:
            self.errors.append(f"{where}: {type(exc).__name__}: {exc}")

    # -- rollouts --------------------------------------------------------------------------------
    def observe(self, trainer):
        import torch

        from tests.gpu import common

        self.trainer = trainer
        rec = {"step": self.step(), "t": time.time() - self.t0, "alloc": _alloc()}
        try:
            engine = dict(trainer.engine.inner_model.named_parameters())
            model = trainer.accelerator.unwrap_model(trainer.model)
            lora = any("lora_A" in n for n, _ in model.named_parameters())
            trainer_params, lora_a = {}, {}
            for n, p in model.named_parameters():
                if "lora_A" in n:
                    lora_a[n] = p
                if "lora_" in n:
                    continue
                n = n.removeprefix("base_model.model.").replace(".base_layer.", ".")
                trainer_params[n] = p
            engine_base = {n.replace(".base_layer.", "."): p for n, p in engine.items()}
            dev = next(iter(engine.values())).device
            if self.checkpoint is None:
                ckpt = os.environ.get("SHIM_SWIFT_MODEL") or getattr(trainer.model, "model_dir", None)
                self.checkpoint = common.load_checkpoint(ckpt, device=str(dev))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            vs_trainer = common.compare_weights(engine_base, trainer_params)
            vs_ckpt = common.compare_weights(engine_base, self.checkpoint)
            rec.update(engine_eq_trainer=vs_trainer["equal"], max_abs_diff_trainer=vs_trainer["max_abs_diff"],
                       unmatched=vs_trainer["unmatched"], engine_eq_checkpoint=vs_ckpt["equal"],
                       max_abs_diff_checkpoint=vs_ckpt["max_abs_diff"], tensors=vs_trainer["tensors"],
                       checksum_engine=common.checksum(engine.values()))
            if lora:
                # the trainer's frozen base against the checkpoint: ms-swift 4.6.0 merges the adapter into the base
                # and unmerges it at every adapter push (_move_adapter_to_vllm), which is lossy in bf16
                drift = 0.0
                for n, p in trainer_params.items():
                    ref = self.checkpoint.get(n)
                    if ref is not None and ref.shape == p.shape:
                        drift = max(drift, float((p.detach().float() - ref.to(p.device).float()).abs().max()))
                rec["trainer_base_drift"] = drift
                rec["lora"] = self.lora_check(trainer, lora_a)
        except Exception as exc:  # recorded, never raised into ms-swift
            rec["error"] = f"{type(exc).__name__}: {exc}"
        self.rollouts.append(rec)

    def lora_check(self, trainer, lora_a: dict) -> dict:
        """The adapter: ``lora_A`` checksums (float64 sums; q/k/v packing does not change them) of the
        trainer, of what ms-swift last pushed (same dtype as the trainer's: exact) and of the engine's
        registered LoRA model (compared after rounding the trainer's to the engine's dtype)."""
        from tests.gpu import common

        out = {"trainer_lora_A_checksum": common.checksum(lora_a.values()), "lora_A_tensors": len(lora_a)}
        push = self.last_lora_push
        if push is not None:
            pushed = [v for k, v in push.items() if "lora_A" in k]
            out["pushed_lora_A_checksum"] = common.checksum(pushed)
            out["pushed_eq_trainer"] = out["pushed_lora_A_checksum"] == common.checksum(
                p.to(pushed[0].dtype) for p in lora_a.values()) if pushed else False
        try:
            runner = trainer.engine.engine.model_executor.driver_worker.worker.model_runner
            manager = runner.lora_manager._adapter_manager
            models = list(manager._registered_adapters.values())
            tensors = []
            for m in models[-1:]:
                for layer in m.loras.values():
                    a = layer.lora_a
                    tensors.extend(x for x in (a if isinstance(a, (list, tuple)) else [a]) if x is not None)
            engine_sum = common.checksum(tensors)
            ref = common.checksum(p.to(tensors[0].dtype) for p in lora_a.values())
            out.update(engine_lora_A_checksum=engine_sum, trainer_lora_A_checksum_engine_dtype=ref,
                       engine_adapters=len(models), engine_lora_A_tensors=len(tensors),
                       engine_eq_trainer=abs(engine_sum - ref) <= 1e-9 * max(1.0, abs(ref)))
        except Exception as exc:
            out["engine_lora"] = f"unreadable: {type(exc).__name__}: {exc}"
        return out

    # -- sleep / wake ----------------------------------------------------------------------------
    def timed(self, op, fn, self_, a, kw):
        import torch

        def free():
            try:
                if torch.cuda.is_available() or "vllm._fake" in sys.modules:
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    return torch.cuda.mem_get_info()[0]
            except Exception:
                return None
            return None

        def pool():
            try:
                from vllm.device_allocator.cumem import CuMemAllocator

                return CuMemAllocator.get_instance().get_current_usage()
            except Exception:
                return None

        rec = {"op": op, "step": self.step(), "t": time.time() - self.t0}
        if op == "sleep":
            rec["level"] = kw.get("level", a[0] if a else 1)
        else:
            tags = kw.get("tags", a[0] if a else None)
            rec["tags"] = list(tags) if tags else None
        rec["pool_before"], f0 = pool(), free()
        t = time.perf_counter()
        try:
            return fn(self_, *a, **kw)
        finally:
            rec["s"] = time.perf_counter() - t
            f1 = free()
            rec["free_before"], rec["free_after"] = f0, f1
            if f0 is not None and f1 is not None:
                rec["freed" if op == "sleep" else "taken"] = (f1 - f0) if op == "sleep" else (f0 - f1)
                if op == "sleep" and rec["pool_before"]:
                    rec["freed_share"] = rec["freed"] / rec["pool_before"]
            self.sleeps.append(rec)

    # -- the end ---------------------------------------------------------------------------------
    def write(self):
        if self.written:
            return
        self.written = True
        try:
            from tests.gpu import common

            t = self.trainer
            metrics = []
            if t is not None and getattr(t, "state", None) is not None:
                metrics = [{k: v for k, v in h.items() if isinstance(v, (int, float))}
                           for h in t.state.log_history]
            decisions = {}
            if "shim" in sys.modules:
                try:
                    from shim.engine import registry

                    decisions = {k: d.text() for k, d in registry.decisions().items()}
                except Exception as exc:
                    decisions = {"error": repr(exc)}
            env = common.env_info()
            for dist in ("ms-swift", "peft", "deepspeed", "modelscope"):
                env[dist] = common._version(dist)
            steady = self.step_s[1:] or self.step_s
            out = {
                "argv": sys.argv, "pid": os.getpid(), "shim_imported": "shim" in sys.modules,
                "decisions": decisions, "user_alloc": self.user_alloc, "alloc_at_step": self.alloc_at_step,
                "alloc_at_end": _alloc(), "rollouts": self.rollouts, "sleep_wake": self.sleeps,
                "step_s": self.step_s,
                "step_s_median_after_first": sorted(steady)[len(steady) // 2] if steady else None,
                "metrics": metrics, "from_pretrained": self.loads,
                "zero3_at_train_begin": self.zero3_at_train_begin, "errors": self.errors,
                "wall_s": time.time() - self.t0, "env": env,
            }
            common.write_json(self.path, out)
        except Exception as exc:
            print(f"[swift_plugin] cannot write {self.path}: {exc!r}", file=sys.stderr, flush=True)


def _rank0() -> bool:
    return os.environ.get("RANK", "0") in ("0", "")


def install(path: str) -> Observer:
    import functools

    obs = Observer(path)

    from swift.rlhf_trainers import rollout_mixin

    mixin = rollout_mixin.RolloutTrainerMixin
    orig_infer = mixin._infer_single_or_multi_turn

    @functools.wraps(orig_infer)
    def _infer_single_or_multi_turn(self, *a, **kw):
        if getattr(self, "vllm_mode", None) == "colocate":
            obs.observe(self)
        return orig_infer(self, *a, **kw)

    mixin._infer_single_or_multi_turn = _infer_single_or_multi_turn

    orig_push = mixin._move_adapter_to_vllm

    @functools.wraps(orig_push)
    def _move_adapter_to_vllm(self, *a, **kw):
        engine = self.engine.engine
        orig_add = engine.add_lora

        def add_lora(req, *x, **y):
            obs.last_lora_push = {k: v.detach().clone() for k, v in (getattr(req, "lora_tensors", None) or {}).items()}
            return orig_add(req, *x, **y)

        engine.add_lora = add_lora
        try:
            return orig_push(self, *a, **kw)
        finally:
            del engine.add_lora

    mixin._move_adapter_to_vllm = _move_adapter_to_vllm

    from vllm.v1.worker import gpu_worker

    worker = gpu_worker.Worker
    for op in ("sleep", "wake_up"):
        fn = getattr(worker, op)

        def wrapper(self_, *a, _fn=fn, _op=("sleep" if op == "sleep" else "wake"), **kw):
            return obs.timed(_op, _fn, self_, a, kw)

        functools.update_wrapper(wrapper, fn)
        setattr(worker, op, wrapper)

    import transformers
    from transformers import TrainerCallback, modeling_utils

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            obs.alloc_at_step.append({"step": state.global_step, **_alloc()})
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            except Exception:
                pass
            obs.step_s.append(time.perf_counter() - self.t)

        def on_train_end(self, args, state, control, **kw):
            obs.write()

    orig_train = transformers.Trainer.train

    @functools.wraps(orig_train)
    def train(self, *a, **kw):
        obs.trainer = self
        try:
            from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

            obs.zero3_at_train_begin = bool(is_deepspeed_zero3_enabled())
        except Exception as exc:
            obs._err("zero3", exc)
        self.add_callback(Timer())
        return orig_train(self, *a, **kw)

    transformers.Trainer.train = train

    orig_fp = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, path, *a, **kw):
        try:
            from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

            z3 = bool(is_deepspeed_zero3_enabled())
        except Exception:
            z3 = None
        obs.loads.append({"path": str(path), "zero3": z3, "device_map": str(kw.get("device_map"))})
        return orig_fp(cls, path, *a, **kw)

    modeling_utils.PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    atexit.register(obs.write)
    return obs


def _cpu_standin():
    """CPU dry run only (tests/fakevllm is vLLM): hardware-facing names ms-swift needs."""
    import importlib

    import torch

    # LoRA (--vllm_enable_lora): the stand-in has vLLM's worker-side LoRA manager that ms-swift's
    # patch_vllm_load_adapter patches (vLLM 0.10.2's API), LoRA layers (``<module>.base_layer.weight``) and
    # applies the adapter at generate: nothing to stand in here.
    # deepspeed's CPU accelerator JIT-compiles a shared-memory all-reduce op with g++ (60-90 s) that only
    # speeds up CPU collectives (as tests/patches/swift_gkd_teacher_zero3/test_swift_gkd.py does).
    try:
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    except ImportError:
        pass
    # vLLM's LoRARequest is a msgspec.Struct, so the fields ms-swift's TensorLoRARequest subclass annotates
    # (peft_config, lora_tensors) become constructor fields; so is the stand-in's where msgspec is installed.
    # Without msgspec the stand-in's is a dataclass, whose plain subclasses gain no fields: make ms-swift's
    # subclass a dataclass too.
    import dataclasses

    from swift.rlhf_trainers import rollout_mixin
    from swift.rlhf_trainers import utils as swift_utils

    cls = getattr(swift_utils, "TensorLoRARequest", None)
    if (cls is not None and dataclasses.is_dataclass(cls)
            and "peft_config" not in {f.name for f in dataclasses.fields(cls)}):
        cls = dataclasses.dataclass(cls)
        swift_utils.TensorLoRARequest = rollout_mixin.TensorLoRARequest = cls
    for name in ("swift.rlhf_trainers.utils", "swift.utils.torch_utils", "swift.utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "get_torch_device"):
            module.get_torch_device = lambda: torch.cuda


if os.environ.get("SHIM_SWIFT_CPU_STANDIN") == "1":
    _cpu_standin()
OBSERVER = install(os.environ["SHIM_SWIFT_OBSERVE"]) if os.environ.get("SHIM_SWIFT_OBSERVE") and _rank0() else None
