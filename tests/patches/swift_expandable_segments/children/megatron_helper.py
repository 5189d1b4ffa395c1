# ms-swift's Megatron allocator helper and rollout-engine init in the ms-swift 4.6.0 venv on the stand-in
# (test_swift_megatron.py run_child): the allocator strings it leaves, printed as JSON. sys.argv[1]: JSON spec.
import json
import os
import sys
import types

spec = json.loads(sys.argv[1])
for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(k, v)
if spec["shim"]:
    import shim.auto  # noqa: F401


from tests.support import mcore_bridge  # noqa: E402

mcore_bridge.install()
import importlib

import torch

targets = [importlib.import_module(name) for name in spec["modules"]]
# vLLM after the targets: in NPU mode the stand-in's torch_npu would make swift.megatron import
# MindSpeed (Ascend's Megatron adaptor), which this CPU venv lacks; transformers caches that check.
import vllm  # noqa: E402
from vllm.platforms import current_platform

from shim.engine import registry

ROUTES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
conf = lambda: {k: os.environ.get(k) for k in ROUTES}  # noqa: E731
utils = importlib.import_module("swift.rlhf_trainers.utils")
out = {"decisions": {k: d.text() for k, d in registry.decisions().items() if k.startswith("swift-exp")},
       "helpers": [t.set_expandable_segments.__module__ for t in targets + [utils]]}
if spec.get("cuda_available"):
    torch.cuda.is_available = lambda: True
if spec["mode"] == "helper":  # the module's own name, as its code calls it
    for target in targets:
        target.set_expandable_segments(False)
        off = conf()
        target.set_expandable_segments(True)
        out[target.__name__] = {"off": off, "on": conf()}
elif spec["mode"] == "init_engine":
    device = getattr(torch, current_platform.device_type)
    if hasattr(utils, "get_torch_device"):
        utils.get_torch_device = lambda: device
    from swift import get_model_processor, get_template
    model, tok = get_model_processor(spec["model"], torch_dtype=torch.float32, model_type="qwen2")
    template = get_template(tok, template_type="qwen")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    args = types.SimpleNamespace(
        max_completion_length=6, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
        stop_words=None, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_tensor_parallel_size=1,
        use_vllm=True, rlhf_type="grpo", lmbda=0.5, offload_model=False, offload_optimizer=False,
        sleep_level=spec["level"], micro_batch_size=2, vllm_max_num_seqs=None, vllm_engine_kwargs=None,
        router_replay_mode=None, tuner_type="full", vllm_enable_lora=False, lora_rank=8,
        model_info=types.SimpleNamespace(model_dir=spec["model"]), torch_dtype=torch.float32,
        model_type="qwen2", vllm_enable_prefix_caching=False, vllm_enforce_eager=True,
        vllm_limit_mm_per_prompt=None, vllm_max_model_len=128, vllm_disable_cascade_attn=False,
        vllm_mm_processor_cache_gb=None)
    from swift.megatron.trainers.rollout_mixin import MegatronRolloutMixin

    class Trainer(MegatronRolloutMixin):
        pass

    t = Trainer.__new__(Trainer)
    t.args, t.template, t.processing_class, t.unwrapped_models = args, template, tok, [model]
    free = lambda: device.mem_get_info()[0]  # noqa: E731
    if current_platform.device_type == "npu":
        from vllm_ascend.device_allocator.camem import CaMemAllocator as Allocator
    else:
        from vllm.device_allocator.cumem import CuMemAllocator as Allocator
    sleeps = []
    original_sleep = vllm.LLMEngine.sleep

    def observed_sleep(self, *args_, **kwargs):
        before, tracked = free(), Allocator.get_instance().get_current_usage()
        result = original_sleep(self, *args_, **kwargs)
        sleeps.append({"freed": free() - before, "tracked": tracked})
        return result

    vllm.LLMEngine.sleep = observed_sleep
    t._init_rollout_engine()
    out.update(sleeps=sleeps, after=conf())
print(json.dumps(out))
