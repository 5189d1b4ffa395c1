"""ms-swift 3.x ``--offload_model`` under ZeRO-3 around vLLM's construction (ms-swift#7801), on real code.

    python tests/scenarios/swift_offload_run.py --model DIR --out DIR [--shim | --wide-probe] [--train-engine]

Run with an ms-swift 3.x venv's python (real ms-swift, transformers, deepspeed 0.19.8 CPU build,
gloo, one rank), tests/fakevllm (a make_site dir) and the repository on PYTHONPATH
(``tests.support.swift_support.run_in_swift``). Prints a JSON summary as its last line.

What runs is ms-swift's own: ``GRPOConfig(deepspeed=<ZeRO-3>, offload_model=True, sleep_level=1)``
(transformers' global ZeRO-3 config), the trainer model loaded by ``get_model_tokenizer`` under
``zero.Init`` (each parameter partitioned: ``param.ds_tensor``, ``param.data`` empty), and the
vLLM construction of the release: 3.10.x ``_prepare_vllm`` (``offload_context`` of ``GRPOTrainer``
-> ``offload_model`` -> ``_prepare_vllm_engine`` + the first sleep -> ``load_model``); 3.9.x the
same lines of ``GRPOTrainer.__init__`` (``with self.offload_context(): self.engine =
self.prepare_vllm(model); sleep``), with the attributes ``__init__`` sets before them.

Hardware stand-in (faithful to CUDA + DeepSpeed, see ``tests/support/residency.py``):
- DeepSpeed on CUDA allocates each partition on the rank's GPU; on the CPU build it is a host
  tensor. Each ``ds_tensor`` is adopted as device memory of the fake GPU after the load, and
  ``Tensor.to`` gets CUDA's semantics for device-resident storages (to the CPU: a new host
  tensor, the device block freed when the old storage dies; to the device: a new device tensor).
- ``get_current_device()`` (imported by name into the module that defines ``load_model``)
  returns ``torch.cuda.current_device()`` = 0 on a CUDA box; on a CPU-only torch it returns
  'cpu', so it is pointed at device index 0 (the fake GPU).
- The fake GPU is sized so that the model's partitions take half of it, and vLLM asks for
  ``vllm_gpu_memory_utilization=0.6``: its start-up check (free memory after ``empty_cache``
  >= 0.6 x total, as vLLM's ``Worker.init_device``) passes only if the offload freed them.
- Real vLLM loads its weights with its own loader, never transformers' ``from_pretrained``;
  the stand-in's engine uses ``from_pretrained``, so transformers' global ZeRO-3 config is
  hidden while the engine is built (else the engine's own copy would be partitioned too).

Observed (test side): at the entry of the engine build (inside ``offload_context``), the bytes of
the trainer's partitions still on the device and the device's free memory; the build's outcome
(vLLM's error); after the context, the partitions' bytes on the device and whether their values
are the ones before (bit for bit). ``--train-engine``: then the offload around a rollout once the
DeepSpeed engine exists (``trained_model_offload``).
"""
import argparse
import importlib
import json
import os

import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shim", action="store_true")
    p.add_argument("--wide-probe", action="store_true",
                   help="activate only swift-zero3-offload, its range widened to <3.13: the probe alone decides")
    p.add_argument("--train-engine", action="store_true",
                   help="then build the DeepSpeed engine (ZeRO-3 optimizer) and run offload_context once more")
    return p.parse_args()


ZERO3 = {"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}},
         "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
         "train_batch_size": "auto", "gradient_clipping": "auto"}


def main():
    a = parse()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", os.environ.get("MASTER_PORT", "29561"))):
        os.environ.setdefault(k, v)
    # deepspeed's CPU backend JIT-compiles a shared-memory all-reduce op (60-90 s); not needed here
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    from shim.engine import registry  # the record only: importing it activates nothing
    from shim.engine.patcher import MARKER

    if a.shim:
        import shim.auto  # noqa: F401
    elif a.wide_probe:
        from shim.engine.catalog import patch_module
        from shim.engine.patch import Patch

        p = patch_module("swift_zero3_offload").PATCH
        registry.activate([Patch(id=p.id, issue=p.issue, distribution=p.distribution,
                                          affected=">=3.10.0,<3.13.0", module=p.module, apply=p.apply,
                                          probe=p.probe)])
    import swift
    import transformers.integrations.deepspeed as hf_ds
    import vllm
    from swift.llm import get_model_tokenizer, get_template
    from swift.trainers import GRPOConfig
    from vllm._fake.device import DEVICE

    from tests.support import residency
    grpo = importlib.import_module("swift.trainers.rlhf_trainer.grpo_trainer")
    try:
        mixin = importlib.import_module("swift.trainers.rlhf_trainer.rollout_mixin")
        legacy = False
    except ImportError:  # 3.5-3.9: offload_model/load_model and the engine build live in GRPOTrainer
        mixin, legacy = grpo, True
    residency.install()
    mixin.get_current_device = lambda: 0  # torch.cuda.current_device() on the GPU the stand-in simulates
    utils = importlib.import_module("swift.trainers.rlhf_trainer.utils")
    if hasattr(utils, "get_torch_device"):
        utils.get_torch_device = lambda: torch.cuda

    args = GRPOConfig(output_dir=os.path.join(a.out, "run"), use_vllm=True, vllm_mode="colocate", sleep_level=1,
                      offload_model=True, deepspeed=dict(ZERO3), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=6, vllm_gpu_memory_utilization=0.6,
                      vllm_max_model_len=128, report_to="none")
    assert hf_ds.is_deepspeed_zero3_enabled()
    model, tok = get_model_tokenizer(a.model, torch.float32, model_type="qwen2")
    template = get_template(model.model_meta.template, tok)
    params = list(model.parameters())
    assert params and all(hasattr(p, "ds_tensor") and p.numel() == 0 for p in params), "not partitioned"

    def partitions():
        return [p.ds_tensor for p in params]

    for t in partitions():  # where DeepSpeed allocates them on CUDA: the rank's GPU
        residency.adopt(t, label="ds_tensor")
    partition_bytes = residency.resident_bytes(partitions())
    DEVICE.total = DEVICE.context + 2 * partition_bytes  # the partitions take half of the GPU
    before = [t.clone() for t in partitions()]

    from tests.support.swift_trainer import bare_trainer

    t = bare_trainer(grpo.GRPOTrainer, args, model, template, tok)
    Trainer = type(t)
    t.ref_model = None
    if legacy:  # the attributes GRPOTrainer.__init__ sets before the engine build (3.9.3 grpo_trainer.py ~175-290)
        from swift.llm import RequestConfig
        for k, v in dict(vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                         vllm_tensor_parallel_size=1, use_vllm=True, use_fast_infer=True, async_generate=False,
                         enable_offload=True, enable_server_multi_turn=False, dynamic_num_samples=False,
                         use_gym_env=False, vllm_use_async_engine=False, _last_loaded_step=-1,
                         completion_length_limit_scope=args.completion_length_limit_scope).items():
            setattr(t, k, v)
        t.request_config = RequestConfig(n=1, max_tokens=args.max_completion_length, temperature=args.temperature,
                                         top_p=args.top_p, top_k=args.top_k, return_details=True)
    else:
        t._prepare_rollout_params()

    build_name = "prepare_vllm" if legacy else "_prepare_vllm_engine"
    build = getattr(grpo.GRPOTrainer, build_name)
    seen = {}

    def observed_build(self, *args_, **kwargs):
        seen["partition_bytes_on_device"] = residency.resident_bytes(partitions())
        seen["free_before_build"] = DEVICE.mem_get_info()[0]
        ref = hf_ds._hf_deepspeed_config_weak_ref
        hf_ds._hf_deepspeed_config_weak_ref = None  # real vLLM never reads transformers' ZeRO-3 config
        try:
            return build(self, *args_, **kwargs)
        finally:
            hf_ds._hf_deepspeed_config_weak_ref = ref

    setattr(Trainer, build_name, observed_build)
    error = None
    try:
        if legacy:  # GRPOTrainer.__init__ (3.9.3 ~291-296)
            with t.offload_context():
                t.engine = t.prepare_vllm(model)
                t.engine.engine.sleep(args.sleep_level)
        else:
            t._prepare_vllm()
    except Exception as exc:  # vLLM's start-up check
        error = [type(exc).__name__, str(exc)]

    after = partitions()  # before the second phase (its optimizer re-points every partition)
    phase1 = {"partition_bytes_on_device_after": residency.resident_bytes(after),
              "partitions_resident_after": sum(residency.is_resident(x) for x in after), "partitions": len(after),
              "values_kept": all(torch.equal(x, y) for x, y in zip(before, after))}
    device_total = DEVICE.total  # the GPU of the vLLM construction (the second phase enlarges it)
    train = trained_model_offload(t, model, params, partition_bytes, residency, DEVICE) if a.train_engine else None

    owner = next(c for c in type(t).__mro__ if "offload_model" in vars(c))
    print(json.dumps({
        "swift": swift.__version__, "vllm": vllm.__version__, "error": error,
        "partition_bytes": partition_bytes, "device_total": device_total,
        "partition_bytes_on_device_at_build": seen.get("partition_bytes_on_device"),
        "free_before_build": seen.get("free_before_build"),
        **phase1,
        "engine_built": getattr(t, "engine", None) is not None,
        "decisions": {k: d.text() for k, d in registry.decisions().items()},
        "train": train,
        "offload_wrapped_by": getattr(vars(owner)["offload_model"], MARKER, None),
        "load_wrapped_by": getattr(vars(owner)["load_model"], MARKER, None),
    }))


def trained_model_offload(t, model, params, partition_bytes, residency, DEVICE):
    """The offload around a rollout once ``train()`` built the DeepSpeed engine: ZeRO-3's optimizer
    (``deepspeed.initialize``, SGD) copies the partitions into one flat ``lp_param_buffer`` (on the
    rank's GPU: adopted) and points every ``ds_tensor`` into it. Device bytes before, inside and after
    ``offload_context`` (after ``empty_cache``, as vLLM's wake does before it maps memory)."""
    import deepspeed

    DEVICE.total += 2 * partition_bytes  # room for the buffer next to the partitions it replaces
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                      config=config)
    buffer = engine.optimizer.lp_param_buffer
    residency.adopt(buffer, label="lp_param_buffer")

    def in_buffer():
        return sum(p.ds_tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for p in params)

    def used():
        torch.cuda.empty_cache()
        return DEVICE.used()

    views, before, values = in_buffer(), used(), [p.ds_tensor.clone() for p in params]
    with t.offload_context():
        inside = used()
    return {"views_in_buffer": views, "buffer_bytes": buffer.untyped_storage().nbytes(), "used_before": before,
            "used_inside": inside, "used_after": used(), "views_after": in_buffer(),
            "values_kept": all(torch.equal(p.ds_tensor, v) for p, v in zip(params, values))}


if __name__ == "__main__":
    main()
