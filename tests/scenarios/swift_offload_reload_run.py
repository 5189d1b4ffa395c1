"""ms-swift 4.x ``offload_context`` around vLLM's construction with the trained model still on the CPU (ms-swift#10109,
#9793), on the real code; prints a JSON summary as its last line.

    python tests/scenarios/swift_offload_reload_run.py --model DIR --out DIR --trainer gkd|grpo [--shim]
                                                        [--ref-model] [--rollout-offload] [--probe PATCH_ID]

Run with an ms-swift 4.x venv's python, tests/fakevllm and the repository on PYTHONPATH
(``tests.support.swift_support.run_in_swift``). What runs is ms-swift's own: the release's ``GKDTrainer`` /
``GRPOTrainer`` (an instance built without its ``__init__``: ``tests/support/swift_trainer.bare_trainer``),
its ``GKDConfig`` / ``GRPOConfig`` (colocate, ``sleep_level=1``, ``offload_model=True``), and the part of
``__init__`` -> ``prepare_rollout`` that builds vLLM: ``_prepare_rollout_params`` and ``_prepare_vllm``
(``offload_context`` of the release's trainer -> ``offload_model`` -> the engine build -> the first sleep ->
``load_model`` on the way out), before any ``accelerator.prepare``.

Placement (test side): the trained model is ms-swift's own HF model (``get_model_processor``), on the CPU as
it is before ``accelerator.prepare`` where nothing placed it on a device (FSDP2: ``device_map=None``; a
ZeRO-2 model loaded on the CPU, the case #10109 reports). ``--ref-model`` (GRPO): a reference model on the device (its parameters adopted
as device memory), as ``prepare_deepspeed`` / ``accelerator.prepare_model`` leave it. ``--rollout-offload``:
afterwards the trained model is put on the device (adopted, as ``accelerator.prepare`` does) and one more
``offload_context`` runs, as around a rollout.

Hardware stand-in (``tests/support/residency.py``): a tensor's bytes are device memory of the stand-in's fake
GPU only where a test adopted them or ``Tensor.to(<device>)`` copied them there (CUDA's semantics for
``.to``: to the device a new device tensor, to the CPU a new host tensor, the device block freed with the
old storage); ``get_current_device()`` (imported by name into ``swift.rlhf_trainers.rollout_mixin``, where
``load_model`` reads it) answers device index 0, as ``torch.cuda.current_device()`` does on a GPU box (on a
CPU-only torch it answers 'cpu'). 4.6.0's ``offload_model`` reads ``tensor.device.type``, which is 'cpu' for
every tensor of a CPU-only torch: on 4.6.0 only the construction with everything on the CPU is faithful
(``--rollout-offload`` and ``--ref-model`` are for 4.0-4.5.x, whose ``offload_model`` moves every tensor).

Observed: after ``_prepare_vllm`` (and after each step of ``--rollout-offload``), the bytes of each model's
parameters on the fake device, and the device's free bytes; whether the engine was built and is asleep.
"""
import argparse
import importlib
import json
import os


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--trainer", choices=("gkd", "grpo"), required=True)
    p.add_argument("--shim", action="store_true")
    p.add_argument("--ref-model", action="store_true", help="GRPO: a reference model on the device")
    p.add_argument("--rollout-offload", action="store_true",
                   help="then the trained model on the device and one more offload_context (4.0-4.5.x)")
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
    import swift
    import torch
    import vllm  # noqa: F401
    from swift import get_model_processor, get_template
    from swift.rlhf_trainers import GKDConfig, GRPOConfig
    from vllm._fake.device import DEVICE
    from vllm.platforms import current_platform

    from tests.support import residency
    from tests.support.swift_trainer import bare_trainer

    mixin = importlib.import_module("swift.rlhf_trainers.rollout_mixin")
    utils = importlib.import_module("swift.rlhf_trainers.utils")
    device = getattr(torch, current_platform.device_type)
    if hasattr(utils, "get_torch_device"):
        utils.get_torch_device = lambda: device
    mixin.get_current_device = lambda: 0  # torch.cuda.current_device() on the GPU box
    if a.trainer == "gkd":
        from swift.rlhf_trainers.gkd_trainer import GKDTrainer as Base
        config = GKDConfig
    else:
        from swift.rlhf_trainers.grpo_trainer import GRPOTrainer as Base
        config = GRPOConfig
    args = config(output_dir=os.path.join(a.out, "run"), use_vllm=True, vllm_mode="colocate", sleep_level=1,
                  offload_model=True, use_cpu=True, per_device_train_batch_size=2, max_completion_length=6,
                  vllm_gpu_memory_utilization=0.3, vllm_max_model_len=128, report_to="none",
                  **({"num_generations": 2} if a.trainer == "grpo" else {}))
    model, tok = get_model_processor(a.model, torch_dtype=torch.float32, model_type="qwen2")
    template = get_template(tok, template_type="qwen")
    t = bare_trainer(Base, args, model, template, tok)
    t.ref_model = None
    residency.install()
    models = {"model": model}
    if a.ref_model:
        ref, _ = get_model_processor(a.model, torch_dtype=torch.float32, model_type="qwen2")
        for p in ref.parameters():
            residency.adopt(p.data, label="reference model")
        t.ref_model = models["ref_model"] = ref

    def snapshot():
        return {"resident": {name: residency.resident_bytes(p.data for p in m.parameters())
                             for name, m in models.items()},
                "free": DEVICE.mem_get_info()[0]}

    sizes = {name: sum(p.numel() * p.element_size() for p in m.parameters()) for name, m in models.items()}
    result = {"swift": swift.__version__, "sizes": sizes, "before": snapshot()}
    t._prepare_rollout_params()
    t._prepare_vllm()
    executor = t.engine.inner_model_executor
    result.update(after_build=snapshot(), engine_asleep=bool(executor.is_sleeping))
    if a.rollout_offload:  # accelerator.prepare put the trained model on the device; then a rollout's context
        for p in model.parameters():
            residency.adopt(p.data, label="trainer model")
        result["rollout_before"] = snapshot()
        with t.offload_context():
            result["rollout_inside"] = snapshot()
        result["rollout_after"] = snapshot()

    from shim.engine import catalog, registry
    from shim.engine.patcher import markers

    probes = {}
    for patch_id in a.probe:  # the probe alone, whatever the version range decided
        row = next(r for r in catalog.index() if r[0] == patch_id)
        record = next(p for p in catalog.patch_module(row[1]).PATCHES if p.id == patch_id)
        probes[patch_id] = record.probe(importlib.import_module(record.module))
    result.update(decisions={k: d.text() for k, d in registry.decisions().items()}, probes=probes,
                  markers=markers(vars(Base)["offload_context"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
