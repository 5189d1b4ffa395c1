"""ms-swift 4.x Megatron colocate rollouts (the REAL ``MegatronRolloutMixin``) on the vLLM stand-in; prints a
JSON summary as its last line.

    python tests/scenarios/swift_megatron_run.py --model DIR [--shim] [--level 1|2] [--offload] [--steps 2]
                                                  [--cycles 2] [--probe PATCH_ID]

Run with an ms-swift 4.x venv's python, tests/fakevllm and the repository on PYTHONPATH
(``tests.support.swift_support.run_in_swift``). What runs is ms-swift's own: the mixin's
``_init_rollout_engine`` (engine build inside ``offload_context``, the first sleep), then ``--steps``
training steps of ``--cycles`` ``_generate_completions`` calls each (several rollouts in one step: GKD per
micro-batch, GRPO dynamic sampling), with the trainer's weights changed between steps; the rollouts'
wakes, weight push (``_move_model_to_vllm`` -> ``_export_and_load_weights`` -> the engine model's
``load_weights``), ``offload_context`` (``offload_megatron_model_to_cpu`` / ``load_megatron_model_to_gpu``
of ``swift.megatron.trainers.utils``) and sleep.

Not real (hardware and the one missing package):
- ``mcore_bridge``: the names-only stand-in of ``tests/support/mcore_bridge.py``; the trainer's ``bridge`` is
  its :class:`~tests.support.mcore_bridge.HFLayoutBridge` (``export_weights`` of a model already in HF layout).
  The trainer's model is ms-swift's own HF model (``get_model_processor``), one chunk, not a Megatron
  ``DDP``: ``offload_megatron_model_to_cpu`` / ``load_megatron_model_to_gpu`` take their non-DDP branch
  (``param.data.to('cpu')`` / ``.to(get_current_device())``, the one ms-swift uses for a reference chunk).
- The trainer's parameters are device memory of the stand-in's fake GPU (``tests/support/residency.py``:
  adopted after the load, as Megatron builds its model on the GPU; ``Tensor.to`` with CUDA's semantics);
  ``get_current_device()`` of ``swift.megatron.trainers.utils`` answers device 0 (on a CPU-only torch it
  answers 'cpu').

Observed: ``order``, each move of the trainer's weights and each engine wake with the bytes of the trainer's
parameters on the device at that moment; at every generate, the engine's weights against the trainer's.
"""
import argparse
import functools
import importlib
import json
import os
import sys
import types


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--shim", action="store_true")
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--cycles", type=int, default=2)
    p.add_argument("--offload", action="store_true", help="--offload_model true")
    p.add_argument("--probe", action="append", default=[],
                   help="patch id: also report what its probe says of this release's module (range aside)")
    return p.parse_args()


def main():
    a = parse()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", os.environ.get("MASTER_PORT", "29561"))):
        os.environ.setdefault(k, v)
    if a.shim:
        import shim.auto  # noqa: F401
    from tests.support import mcore_bridge

    mcore_bridge.install()
    import torch

    mixin_module = importlib.import_module("swift.megatron.trainers.rollout_mixin")
    megatron_utils = importlib.import_module("swift.megatron.trainers.utils")
    import vllm  # after swift.megatron (see tests/test_swift_megatron.py)
    from vllm._fake import fingerprint
    from vllm._fake.device import DEVICE
    from vllm.platforms import current_platform

    from tests.support import residency

    swift = importlib.import_module("swift")
    device = getattr(torch, current_platform.device_type)
    utils = importlib.import_module("swift.rlhf_trainers.utils")
    if hasattr(utils, "get_torch_device"):
        utils.get_torch_device = lambda: device
    megatron_utils.get_current_device = lambda: 0  # torch.cuda.current_device() on the GPU box
    from swift import get_model_processor, get_template
    model, tok = get_model_processor(a.model, torch_dtype=torch.float32, model_type="qwen2")
    template = get_template(tok, template_type="qwen")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    args = types.SimpleNamespace(
        max_completion_length=6, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
        stop_words=None, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_tensor_parallel_size=1,
        use_vllm=True, rlhf_type="grpo", lmbda=0.5, offload_model=a.offload, offload_optimizer=False,
        offload_bridge=False, sleep_level=a.level, micro_batch_size=2, vllm_max_num_seqs=None,
        vllm_engine_kwargs=None, router_replay_mode=None, tuner_type="full", vllm_enable_lora=False, lora_rank=8,
        model_info=types.SimpleNamespace(model_dir=a.model), torch_dtype=torch.float32,
        model_type="qwen2", vllm_enable_prefix_caching=False, vllm_enforce_eager=True,
        vllm_limit_mm_per_prompt=None, vllm_max_model_len=128, vllm_disable_cascade_attn=False,
        vllm_mm_processor_cache_gb=None, async_generate=False, use_gym_env=False, report_to=[])

    from swift.megatron.trainers.grpo_trainer import MegatronGRPOTrainer

    class Trainer(MegatronGRPOTrainer):  # the release's trainer, built without its __init__
        pass

    t = Trainer.__new__(Trainer)
    t.args, t.template, t.processing_class = args, template, tok
    t.unwrapped_models = t.wrapped_models = [model]
    t.bridge = mcore_bridge.HFLayoutBridge()
    t._last_loaded_step, t._step = -1, 0  # MegatronRolloutMixin.__init__ (_init_grpo_params)

    residency.install()
    for p in model.parameters():  # Megatron builds the model on the GPU
        residency.adopt(p.data, label="trainer model")
    trainer_bytes = lambda: residency.resident_bytes(p.data for p in model.parameters())  # noqa: E731

    order = []
    engine_cls = vllm.LLMEngine
    original_wake = engine_cls.wake_up

    @functools.wraps(original_wake)  # ms-swift reads the signature for `tags`
    def observed_wake(self, *args_, **kwargs):
        tags = kwargs.get("tags", args_[0] if args_ else None)
        result = original_wake(self, *args_, **kwargs)
        resident = trainer_bytes()
        order.append({"event": "wake_up", "tags": tags, "step": t._step, "trainer_on_device": resident > 0,
                      "trainer_bytes": resident, "used": DEVICE.used()})
        return result

    engine_cls.wake_up = observed_wake
    for name, event in (("offload_megatron_model_to_cpu", "trainer_to_cpu"),
                        ("load_megatron_model_to_gpu", "trainer_to_device")):
        real = getattr(mixin_module, name)  # the mixin imports them by name

        def observed(models, *args_, _real=real, _event=event, **kwargs):
            result = _real(models, *args_, **kwargs)
            order.append({"event": _event, "step": t._step, "trainer_bytes": trainer_bytes()})
            return result

        setattr(mixin_module, name, observed)

    t._init_rollout_engine()
    runner = t.engine.inner_model_executor.driver_worker.model_runner
    generates = []
    original_run = engine_cls.run_requests

    def observed_run(self, *args_, **kwargs):
        generates.append({"step": t._step, "engine": runner.weights_fp(),
                          "trainer": fingerprint(model.named_parameters()), "origin": runner.weights_origin})
        return original_run(self, *args_, **kwargs)

    engine_cls.run_requests = observed_run
    from swift.rl_core.data import OnPolicySample

    for step in range(a.steps):
        if step:
            with torch.no_grad():  # an optimizer step changes the trained weights
                for p in model.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            t._step = step
        for _ in range(a.cycles):
            t._generate_completions([OnPolicySample(messages=[{"role": "user", "content": "hello world"}])
                                     for _ in range(2)])

    from shim.engine import catalog, registry
    from shim.engine.patcher import markers

    probes = {}
    for patch_id in a.probe:  # the probe alone, whatever the version range decided
        row = next(r for r in catalog.index() if r[0] == patch_id)
        record = next(p for p in catalog.patch_module(row[1]).PATCHES if p.id == patch_id)
        probes[patch_id] = record.probe(importlib.import_module(record.module))
    print(json.dumps({
        "swift": swift.__version__, "generates": generates,
        "mismatches": sum(1 for g in generates if g["engine"] != g["trainer"]),
        "decisions": {k: d.text() for k, d in registry.decisions().items()},
        "markers": markers(vars(mixin_module.MegatronRolloutMixin)["_generate_completions"]),
        "order": order, "probes": probes,
    }))


if __name__ == "__main__":
    sys.exit(main())
