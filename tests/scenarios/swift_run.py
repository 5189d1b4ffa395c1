"""ms-swift's real colocate rollout code on the vLLM stand-in; prints a JSON summary as its last line.

    python tests/scenarios/swift_run.py --model DIR [--shim] [--level 1|2] [--cycles 2] [--steps 2] [--lora]
        [--lora-merge]

Run with an ms-swift venv's python and tests/fakevllm (or a make_site dir) plus
the repository on PYTHONPATH (``tests.support.swift_support.run_swift``). Drives the
REAL ``RolloutTrainerMixin``: ``_prepare_rollout_params`` and ``_prepare_vllm``
(engine build through ``_prepare_vllm_engine`` + the first sleep), then
``--steps`` training steps of ``--cycles`` ``_fast_infer`` calls each (several
rollouts in one step: GKD per micro-batch, GRPO dynamic sampling), with the
trainer's weights changed between steps (an optimizer step). The trainer model,
template and arguments are ms-swift's own (``get_model_tokenizer``,
``get_template``, ``GRPOConfig``).

Observation (test-side, on the stand-in): at every real generate the engine's
weights are compared with the trainer model's parameters; each sleep's freed
bytes are read from the fake device's ``mem_get_info``.

``--lora`` (3.10.x): ``--train_type lora --vllm_enable_lora true`` -- the trainer model
is ms-swift's own LoRA model (``Swift.prepare_model``, rank 8 on every linear layer of
the decoder), the engine is built with ``enable_lora`` (vLLM LoRA layers, adapters
pushed with ``add_lora`` through ms-swift's ``patch_vllm_load_adapter``), an optimizer
step changes only the adapter, and each generate compares the weights the engine's
forward computes with (base + the slot of the request's adapter,
``vllm._fake.lora.effective_weights``) with the trainer's merged weights
(base + scaling x B @ A), within 1e-6.

``--lora-merge`` (3.10+): ``--tuner_type lora`` (3.x: ``--train_type lora``) with vLLM's own LoRA off, so ms-swift merges the
adapter into every full push (``_move_full_model_to_vllm``: ``merge_adapter``, push, ``unmerge_adapter``).
The trainer model is the model in bfloat16 wrapped by ``peft.get_peft_model`` (what ``--tuner_type
lora`` builds through ``Swift.prepare_model``; rank 4 on ``q_proj``, ``v_proj`` and ``embed_tokens``, so
``lora.Linear`` and ``lora.Embedding`` layers, ``init_lora_weights=False`` so every push carries a
delta). Each generate also records, through ``tests.support.lora_check``: the frozen base elements
whose bytes differ from the model before the first push (``base_changed``), the engine elements further
than one bfloat16 rounding from base plus adapter merged out of place (``beyond``), and per LoRA layer
class the elements the adapter moves (``effect``). ``--vllm-lora``: vLLM's own LoRA on
(``--vllm_enable_lora true``; adapter on ``q_proj``/``v_proj`` only): the base is pushed once, then
``_move_adapter_to_vllm`` pushes the adapter (merging and unmerging around it); ``beyond`` is not
recorded (the engine's adapter slot is mapped per request, after this observation point), ``adapter_off``
is (:func:`adapter_off`); ``--adapter-fault`` injects a fault at the engine's ``add_lora``, ``--zero-b``
starts ``lora_B`` at zero.

Hardware stand-in: ms-swift's ``get_torch_device()`` returns ``torch.cpu`` on a
CPU-only torch, whose API lacks ``memory_reserved``; it is pointed at the
device the stand-in simulates (``torch.cuda`` / ``torch.npu``).

``--offload`` (3.10+): ``offload_model`` on, and the trainer gets the release's own
``GRPOTrainer.offload_context`` (``RolloutTrainerMixin``'s is a placeholder that
subclasses override). Hardware stand-in for the trainer's model on the device: on a
GPU, ``load_model``'s ``param.data.to(cuda)`` allocates the model's bytes on the
device and ``offload_model``'s ``.to("cpu")`` + ``empty_cache()`` gives them back;
on this CPU torch both are no-ops, so around the release's real ``offload_model`` /
``load_model`` the scenario books the same bytes on the fake device (the model
starts on it, as after ``accelerator.prepare``). 4.6.0's ``offload_model`` returns
whether a tensor left the device: here it answers for the stand-in's placement
(True where the model was booked on the device), as it would on the GPU. Each move
is an event (``trainer_to_cpu`` / ``trainer_to_device``) in the stand-in's log, so
``order`` gives the sequence of moves and wakes, each wake with whether the trainer
model was on the device and the device's used bytes at that moment.
"""
import argparse
import functools
import importlib
import json
import os
import sys

import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shim", action="store_true")
    p.add_argument("--level", type=int, default=2)
    p.add_argument("--cycles", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lora", action="store_true", help="--train_type lora --vllm_enable_lora true (3.10.x)")
    p.add_argument("--lora-merge", action="store_true",
                   help="3.10+: --tuner_type lora without vLLM LoRA (the adapter merged into every full push), bf16")
    p.add_argument("--vllm-lora", action="store_true",
                   help="with --lora-merge: vLLM's own LoRA on (--vllm_enable_lora true), adapter on q_proj/v_proj")
    p.add_argument("--offload", action="store_true",
                   help="3.10+: --offload_model true, with the release's GRPOTrainer.offload_context (the mixin's is a "
                        "placeholder) and the trainer model's device memory booked on the fake device")
    p.add_argument("--grpo-module", action="store_true",
                   help="import the release's GRPOTrainer module first, as a real GRPO run does (it imports TRL's "
                        "GRPOTrainer, and with TRL >= 0.28 trl.generation.vllm_generation)")
    p.add_argument("--skip-push", default="",
                   help="every push leaves this engine tensor out (the stand-in model's load_weights skips it)")
    p.add_argument("--adapter-fault", default="",
                   help="with --vllm-lora: drop:<module> (every adapter push leaves that module's lora_A/lora_B out), "
                        "stale:<PEFT tensor name> (every adapter push carries that tensor as at the first one) or "
                        "slot:<module> (after each push that module's device slot of the adapter is zeroed)")
    p.add_argument("--zero-b", action="store_true",
                   help="with --lora-merge: lora_B initialised to zero (PEFT's default), so the adapter starts a no-op")
    p.add_argument("--probe", action="append", default=[],
                   help="patch id: also report what its probe says of this release's module (range aside)")
    p.add_argument("--cuda-available", action="store_true",
                   help="after set-up, torch.cuda.is_available() answers True (the hardware a CUDA user has), so "
                        "ms-swift's CUDA-only set_expandable_segments acts")
    return p.parse_args()


def lora_merge_args(config_class, a) -> dict:
    """--lora-merge: ``--tuner_type lora`` (3.x: ``--train_type lora``), vLLM's LoRA as ``--vllm-lora`` says."""
    import dataclasses

    key = "tuner_type" if "tuner_type" in {f.name for f in dataclasses.fields(config_class)} else "train_type"
    return {key: "lora", "vllm_enable_lora": a.vllm_lora, "lora_rank": 4}


def lora_merge_model(model, a):
    """--lora-merge: the model wrapped by ``peft.get_peft_model`` (what ``Swift.prepare_model`` builds for a
    LoraConfig), rank 4, adapter weights initialised non-zero."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "v_proj"] + ([] if a.vllm_lora else ["embed_tokens"])
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                                  target_modules=targets))
    if a.zero_b:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.zero_()
    return peft_model


def adapter_off(model, engine_model) -> list:
    """--vllm-lora, the observation: the trainer's LoRA modules whose delta (``scaling * B @ A``) the engine's adapter
    (the most recently registered in its LoRA manager, the one ms-swift's rollout picks with ``max_loras`` 1; the
    stand-in stores ``lora_a`` ``[in, r]`` and ``lora_b`` ``[r, out]`` with the scaling folded in) does not give
    within 2% of the delta's largest element (bf16 rounding of A and B is far below that); a module the adapter
    lacks counts where the trainer's delta is not zero."""
    from peft.tuners.lora import LoraLayer

    adapters = list(engine_model.lora_manager.list_adapters().values())
    loras = adapters[-1].loras if adapters else {}
    off = []
    for name, m in model.named_modules():
        if not isinstance(m, LoraLayer) or "default" not in m.lora_A:
            continue
        module = name.removeprefix("base_model.model.")
        want = m.scaling["default"] * (m.lora_B["default"].weight.detach().double() @ m.lora_A["default"].weight.detach().double())
        w = loras.get(module)
        got = (w.lora_a.double() @ w.lora_b.double()).T if w is not None else torch.zeros_like(want)
        if float((got - want).abs().max()) > 0.02 * float(want.abs().max()):
            off.append(module)
    return off


def main():
    a = parse()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", os.environ.get("MASTER_PORT", "29561"))):
        os.environ.setdefault(k, v)
    if a.shim:
        import shim.auto  # noqa: F401
    import swift
    import vllm
    from vllm._fake import EVENTS, fingerprint
    from vllm.platforms import current_platform
    legacy = False  # 3.2-3.9: the colocate rollout code lives in GRPOTrainer itself (no rollout mixin)
    try:
        from swift.trainers import GRPOConfig
        from swift.trainers.rlhf_trainer.rollout_mixin import RolloutTrainerMixin
        utils_modules = ("swift.trainers.rlhf_trainer.utils",)
    except ImportError:
        try:
            from swift.rlhf_trainers import GRPOConfig
            from swift.rlhf_trainers.rollout_mixin import RolloutTrainerMixin
            utils_modules = ("swift.rlhf_trainers.utils",)
        except ImportError:
            from swift.trainers import GRPOConfig
            from swift.trainers.rlhf_trainer.grpo_trainer import GRPOTrainer as RolloutTrainerMixin
            utils_modules = ("swift.trainers.rlhf_trainer.utils",)
            legacy = True
    if a.grpo_module:
        try:
            importlib.import_module("swift.rlhf_trainers.grpo_trainer")
        except ImportError:  # 3.x
            importlib.import_module("swift.trainers.rlhf_trainer.grpo_trainer")
    device = getattr(torch, current_platform.device_type)
    for name in utils_modules:
        module = importlib.import_module(name)
        if hasattr(module, "get_torch_device"):
            module.get_torch_device = lambda: device

    args = GRPOConfig(output_dir=os.path.join(a.out, "run"), use_vllm=True, vllm_mode="colocate",
                      sleep_level=a.level, use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=6, vllm_gpu_memory_utilization=0.3, vllm_max_model_len=128,
                      report_to="none", **(dict(train_type="lora", vllm_enable_lora=True, lora_rank=8)
                                           if a.lora else lora_merge_args(GRPOConfig, a) if a.lora_merge else {}))
    try:  # 3.10.x
        from swift.llm import get_model_tokenizer, get_template
        model, tok = get_model_tokenizer(a.model, torch.bfloat16 if a.lora_merge else torch.float32,
                                         model_type="qwen2")
        template = get_template(model.model_meta.template, tok)
        if a.lora_merge:
            model = lora_merge_model(model, a)
        if a.lora:  # what ms-swift's prepare_adapter builds for --train_type lora (all-linear, rank 8, alpha 32)
            from swift.tuners import LoraConfig, Swift
            model = Swift.prepare_model(model, LoraConfig(
                r=8, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    except ImportError:  # 4.x
        from swift import get_model_processor, get_template
        model, tok = get_model_processor(a.model, torch_dtype=torch.bfloat16 if a.lora_merge else torch.float32,
                                         model_type="qwen2")
        template = get_template(tok, template_type="qwen")
        if a.lora_merge:
            model = lora_merge_model(model, a)

    from tests.support.swift_trainer import bare_trainer

    t = bare_trainer(RolloutTrainerMixin, args, model, template, tok)
    Trainer = type(t)
    trainer_on_device, order = None, []  # --offload: the trainer's moves and the engine's wakes, in order
    if a.offload:
        try:
            from swift.rlhf_trainers.grpo_trainer import GRPOTrainer
        except ImportError:  # 3.x
            from swift.trainers.rlhf_trainer.grpo_trainer import GRPOTrainer
        from vllm._fake import log_event
        from vllm._fake.device import DEVICE

        Trainer.offload_context = GRPOTrainer.offload_context  # the release's own
        args.offload_model = True
        t.ref_model = None
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        trainer_on_device = [DEVICE.allocate(model_bytes, label="trainer model")]  # after accelerator.prepare
        real_offload, real_load = t.offload_model, t.load_model

        def offload_model(m):
            moved = real_offload(m)
            if m is model and trainer_on_device[0] is not None:
                DEVICE.free(trainer_on_device[0])
                DEVICE.empty_cache()  # offload_model's torch.cuda.empty_cache()
                trainer_on_device[0] = None
                log_event("trainer_to_cpu", nbytes=model_bytes)
                order.append({"event": "trainer_to_cpu", "step": t.state.global_step})
                return True
            return moved

        def load_model(m):
            real_load(m)
            if m is model and trainer_on_device[0] is None:
                trainer_on_device[0] = DEVICE.allocate(model_bytes, label="trainer model")
                log_event("trainer_to_device", nbytes=model_bytes)
                order.append({"event": "trainer_to_device", "step": t.state.global_step})

        t.offload_model, t.load_model = offload_model, load_model
    if legacy:  # the attributes GRPOTrainer.__init__ sets for a colocate rollout (3.9.3 grpo_trainer.py ~175-330)
        from swift.llm import RequestConfig
        for k, v in dict(vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                         vllm_tensor_parallel_size=1, use_vllm=True, use_fast_infer=True, async_generate=False,
                         enable_offload=a.offload, enable_server_multi_turn=False, dynamic_num_samples=False,
                         use_gym_env=False, vllm_use_async_engine=False, _last_loaded_step=-1,
                         completion_length_limit_scope=args.completion_length_limit_scope).items():
            setattr(t, k, v)
        t.request_config = RequestConfig(n=1, max_tokens=args.max_completion_length, temperature=args.temperature,
                                         top_p=args.top_p, top_k=args.top_k, return_details=True)
    else:
        t._prepare_rollout_params()

    free = lambda: device.mem_get_info()[0]  # noqa: E731
    sleeps = []
    engine_cls = vllm.LLMEngine
    original_sleep = engine_cls.sleep

    def pool_bytes():
        if current_platform.device_type == "npu":
            from vllm_ascend.device_allocator.camem import CaMemAllocator as Allocator
        else:
            from vllm.device_allocator.cumem import CuMemAllocator as Allocator
        return Allocator.get_instance().get_current_usage()

    def observed_sleep(self, *args_, **kwargs):
        before, tracked = free(), pool_bytes()
        result = original_sleep(self, *args_, **kwargs)
        sleeps.append({"freed": free() - before, "tracked": tracked})
        return result

    engine_cls.sleep = observed_sleep
    if a.offload:
        original_wake = engine_cls.wake_up

        @functools.wraps(original_wake)  # ms-swift reads the signature for `tags`
        def observed_wake(self, *args_, **kwargs):
            tags = kwargs.get("tags", args_[0] if args_ else None)
            result = original_wake(self, *args_, **kwargs)
            order.append({"event": "wake_up", "tags": tags, "step": t.state.global_step,
                          "trainer_on_device": trainer_on_device[0] is not None, "used": DEVICE.used()})
            return result

        engine_cls.wake_up = observed_wake
    if a.cuda_available:
        torch.cuda.is_available = lambda: True
    if legacy:  # GRPOTrainer.__init__: engine build, then the first sleep
        t.engine = t.prepare_vllm(model)
        if args.sleep_level > 0:
            t.engine.engine.sleep(args.sleep_level)
    else:
        t._prepare_vllm()
    if not hasattr(t, "parameter_groups"):  # 4.x: prepare_rollout() splits after _prepare_vllm()
        t.parameter_groups, t.parameter_groups_no_lora = t.split_batches()

    runner = t.engine.inner_model_executor.driver_worker.model_runner
    if a.skip_push:
        from vllm.v1.worker.gpu_model_runner import VllmModelMixin  # the stand-in model's load_weights

        push_weights = VllmModelMixin.load_weights

        def partial_push(self, weights):
            return push_weights(self, [(n, w) for n, w in weights if n != a.skip_push])

        VllmModelMixin.load_weights = partial_push
    if a.adapter_fault:  # the engine's add_lora (what ms-swift's _move_adapter_to_vllm calls) gets a faulty adapter
        kind, _, target = a.adapter_fault.partition(":")
        own_add_lora, first = engine_cls.add_lora, {}

        def faulty_add_lora(self, lora_request):
            tensors = dict(lora_request.lora_tensors)
            if kind == "drop":
                tensors = {n: t for n, t in tensors.items() if f".{target}.lora_" not in f".{n}"}
            elif kind == "stale":
                tensors[target] = first.setdefault(target, tensors[target].clone())
            lora_request.lora_tensors = tensors
            result = own_add_lora(self, lora_request)
            if kind == "slot":  # the adapter registered and active, its device slot of that module zeroed
                manager = runner.model.lora_manager
                manager.modules[target].reset_lora(manager.lora_index_to_id.index(lora_request.lora_int_id))
            return result

        engine_cls.add_lora = faulty_add_lora
    import logging

    warnings = []

    class Collect(logging.Handler):  # the shim's WARNING lines (its logger does not propagate)
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logging.getLogger("shim").addHandler(Collect())
    pushes = [0]
    if hasattr(t, "_move_model_to_vllm"):  # counted here, outside the shim: the trainer's own pushes
        own_push = t._move_model_to_vllm  # bound through the class (and any wrapper on it)

        def counted_push(*args_, **kwargs):
            result = own_push(*args_, **kwargs)
            pushes[0] += 1
            return result

        t._move_model_to_vllm = counted_push
    generates = []
    original_run = engine_cls.run_requests

    if a.lora_merge:
        from tests.support import lora_check
        base_before = lora_check.base_snapshot(t.model)

    def observed_run(self, *args_, **kwargs):
        trainer_fp = fingerprint(t.model.named_parameters())
        generates.append({"step": t.state.global_step, "engine": runner.weights_fp(), "trainer": trainer_fp,
                          "origin": runner.weights_origin})
        if a.lora_merge:
            generates[-1].update(  # vLLM's LoRA: its adapter slot is mapped later, per request: base only
                base_changed=lora_check.changed_elements(t.model, base_before),
                beyond=None if a.vllm_lora else lora_check.beyond_one_rounding(
                    dict(runner.model.named_parameters()), lora_check.reference(t.model), torch.bfloat16),
                effect=lora_check.adapter_effect(t.model, torch.bfloat16))
            generates[-1]["engine"] = generates[-1]["trainer"] = None  # names differ: the LoRA figures decide
            if a.vllm_lora:
                generates[-1]["adapter_off"] = adapter_off(t.model, runner.model)
        return original_run(self, *args_, **kwargs)

    if a.lora:
        from vllm._fake.lora import effective_weights
        original_one = runner.generate_one

        def merged_trainer_weights():
            from peft.tuners.lora import LoraLayer
            out, lora_modules = {}, set()
            for name, m in t.model.named_modules():
                if isinstance(m, LoraLayer) and hasattr(m, "base_layer"):
                    key = name.removeprefix("base_model.model.")
                    lora_modules.add(name)
                    b = m.lora_B["default"].weight.detach().double()
                    out[f"{key}.weight"] = (m.base_layer.weight.detach().double()
                                            + m.scaling["default"] * b @ m.lora_A["default"].weight.detach().double())
                    if m.base_layer.bias is not None:
                        out[f"{key}.bias"] = m.base_layer.bias.detach().double()
            for name, p in t.model.named_parameters():
                if not any(name.startswith(f"{x}.") for x in lora_modules):
                    out[name.removeprefix("base_model.model.")] = p.detach().double()
            return out

        pending = []

        def observed_lora_run(self, *args_, **kwargs):  # one record per batch: at its first forward
            pending[:] = [t.state.global_step]
            return original_run(self, *args_, **kwargs)

        def observed_one(*args_, **kwargs):  # after the request's adapter was mapped (set_active_loras)
            if pending:
                engine, trainer = effective_weights(runner.model), merged_trainer_weights()
                assert engine.keys() == trainer.keys(), sorted(engine.keys() ^ trainer.keys())
                diffs = {k: float((engine[k] - trainer[k]).abs().max()) for k in engine}
                diff = max(diffs.values())
                worst = sorted(diffs, key=diffs.get)[-3:]
                generates.append({"step": pending.pop(), "origin": runner.weights_origin, "max_diff": diff,
                                  "mismatch": not diff < 1e-6, "worst": {k: diffs[k] for k in worst},
                                  "slot": runner.model.lora_manager.punica_wrapper.index,  # -1: no adapter
                                  "loras": sorted(runner.list_loras())})
            return original_one(*args_, **kwargs)

        runner.generate_one = observed_one
        engine_cls.run_requests = observed_lora_run
    else:
        engine_cls.run_requests = observed_run
    messages = [{"role": "user", "content": "hello world"}]
    try:  # 4.x rollouts take OnPolicySample objects
        from swift.rl_core.data import OnPolicySample

        make_inputs = lambda: [OnPolicySample(messages=[dict(m) for m in messages]) for _ in range(2)]  # noqa: E731
    except ImportError:
        make_inputs = lambda: [{"messages": [dict(m) for m in messages]} for _ in range(2)]  # noqa: E731
    for step in range(a.steps):
        if step:
            with torch.no_grad():  # an optimizer step changes the trained weights (LoRA: the adapter only)
                for p in t.model.parameters():
                    if p.requires_grad or not (a.lora or a.lora_merge):
                        p.add_(0.01 * torch.randn_like(p))
            t.state.global_step = step
        for _ in range(a.cycles):
            t._fast_infer(make_inputs())

    from shim.engine import catalog, registry
    from shim.engine.patcher import MARKER, markers

    probes = {}
    for patch_id in a.probe:  # the probe alone, whatever the version range decided
        row = next(r for r in catalog.index() if r[0] == patch_id)
        record = next(p for p in catalog.patch_module(row[1]).PATCHES if p.id == patch_id)
        probes[patch_id] = record.probe(importlib.import_module(record.module))
    owner = next(c for c in type(t).__mro__ if "_fast_infer" in vars(c))  # the release's own class
    tracked = runner.weights_alloc.nbytes if hasattr(runner.weights_alloc, "nbytes") else None
    print(json.dumps({
        "swift": swift.__version__, "vllm": vllm.__version__, "generates": generates,
        "mismatches": sum(1 for g in generates if g.get("mismatch", g.get("engine") != g.get("trainer"))),
        "garbage": sum(1 for g in generates if g["origin"] == "garbage"),
        "sleeps": sleeps, "weights_bytes": tracked,
        "alloc_env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                                      "PYTORCH_NPU_ALLOC_CONF")},
        "decisions": {k: d.text() for k, d in registry.decisions().items()},
        "fast_infer_wrapped_by": getattr(vars(owner)["_fast_infer"], MARKER, None),
        "fast_infer_markers": markers(vars(owner)["_fast_infer"]),
        "pushes": pushes[0],
        "weight_pushes": (sys.modules["shim.observe.events"].totals().get("weight_pushes")
                          if "shim.observe.events" in sys.modules else None),
        "verify": ({k: v for k, v in sys.modules["shim.verify.weights"].counts().items() if k != "times"}
                   if "shim.verify.weights" in sys.modules else None),
        "shim_warnings": warnings,
        "events": [e["event"] for e in EVENTS if e["event"] in ("sleep", "wake_up", "generate", "reload_weights")],
        "sleep_levels": [e["level"] for e in EVENTS if e["event"] == "sleep"],
        "order": order,
        "probes": probes,
    }))


if __name__ == "__main__":
    main()
