# ms-swift's SwiftRLHF for GKD (student and teacher loaded through _prepare_single_model) in an ms-swift venv
# (test_swift_gkd.py run_child): every from_pretrained (ZeRO-3 seen, device_map), the files opened under the
# teacher's directory, the teacher's partitioning, printed as JSON. sys.argv[1]: JSON spec.
import json
import sys
import time

T0 = time.monotonic()
def mark(what):
    print(f"[t] {what} {time.monotonic() - T0:.1f}s", file=sys.stderr, flush=True)
spec = json.loads(sys.argv[1])
opened = []
tdir = spec["teacher"]
sys.addaudithook(lambda ev, a: opened.append(str(a[0])) if ev == "open" and isinstance(a[0], str)
                 and a[0].startswith(tdir) else None)
# CPU only: deepspeed's TorchBackend JIT-compiles a shared-memory all-reduce op with g++ (60-90 s,
# and again for every venv, since the torch_extensions hash includes the source path). It only
# speeds up CPU collectives; the ZeRO-3 load does not need it.
# (importlib, not `import deepspeed.comm.torch as m`: that binds the `torch` package that
# deepspeed.comm re-exports under the same name, and the patch would miss.)
import importlib

_ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
_ds_comm_torch.build_shm_op = lambda: None
if spec["shim"]:
    import shim.auto  # noqa: F401
    import shim.deepspeed.teacher as dt
    dt.device_memory = lambda: (spec["free"], spec["free"])
    dt.world_size = lambda: spec["world"]
import transformers.integrations.deepspeed as hf_ds
from transformers import modeling_utils

loads = []
_orig = modeling_utils.PreTrainedModel.from_pretrained.__func__
def _from_pretrained(cls, path, *a, **k):
    loads.append({"path": str(path), "zero3": hf_ds.is_deepspeed_zero3_enabled(), "device_map": str(k.get("device_map"))})
    if spec.get("fail_teacher") and str(path) == tdir:  # a fault while the teacher loads (OOM, bad shard)
        raise RuntimeError("teacher load failed")
    return _orig(cls, path, *a, **k)
modeling_utils.PreTrainedModel.from_pretrained = classmethod(_from_pretrained)
try:
    from swift.llm import RLHFArguments
    from swift.llm.train.rlhf import SwiftRLHF
except ImportError:
    from swift.arguments import RLHFArguments
    from swift.pipelines.train.rlhf import SwiftRLHF
kw = dict(rlhf_type="gkd", model=spec["student"], model_type="qwen2", teacher_model=tdir,
          deepspeed="zero2", dataset=[spec["data"]], output_dir=spec["out"], report_to=["none"],
          torch_dtype=spec.get("dtype", "float32"), template="qwen2_5")
if kw["torch_dtype"] != "float32":  # a CPU run: no bf16 mixed-precision training (transformers refuses it)
    kw["bf16"] = False
if spec["teacher_type"]:
    kw["teacher_model_type"] = spec["teacher_type"]
if spec["teacher_ds"]:
    kw["teacher_deepspeed"] = spec["teacher_ds"]
mark("imports")
args = RLHFArguments(**kw)
mark("args")
result = {"loads": loads, "opened": opened, "error": None}
try:
    pipe = SwiftRLHF(args)
    w = next(pipe.teacher_model.parameters())
    result["teacher_partitioned"] = hasattr(w, "ds_id") and w.numel() == 0
    result["teacher_ds_numel"] = int(getattr(w, "ds_numel", w.numel()))
except Exception as exc:
    result["error"] = [type(exc).__name__, str(exc)]
mark("pipeline")
ref = hf_ds._hf_deepspeed_config_weak_ref
result["after_zero3"] = hf_ds.is_deepspeed_zero3_enabled()
result["after_is_student"] = ref is not None and ref() is args.training_args.hf_deepspeed_config
result["after_stage"] = ref().config["zero_optimization"]["stage"] if ref is not None and ref() is not None else None
print(json.dumps(result))
