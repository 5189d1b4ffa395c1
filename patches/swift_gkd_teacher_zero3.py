"""ms-swift GKD: a ZeRO-3 teacher is loaded whole on every rank under a non-ZeRO-3 student.

Upstream: modelscope/ms-swift#6639 (OOM at 31% of the teacher checkpoint; workaround #6413)
Affects:  ms-swift >=3.10.0,<4.0.0 (swift.llm.train.rlhf) and >=4.0.0 (-4x, swift.pipelines.train.rlhf);
          3.10.1+ builds the real teacher class, 3.10.0 the student's;
          with --teacher_deepspeed zero3 and a --deepspeed that is not ZeRO-3 (zero0/1/2, none)
Remove:   when ms-swift loads a ZeRO-3 teacher under its own config (the probe sees it)

``SwiftRLHF._prepare_single_model('teacher', ...)`` loads the teacher under
transformers' process-global DeepSpeed config, which is the student's. A ZeRO-2
student therefore loads the whole teacher onto every rank (``device_map=cuda:N``);
``teacher_deepspeed zero3`` partitions it only afterwards, in ``prepare_deepspeed``.
The shim wraps ``_prepare_single_model`` (the class attribute of the concrete
module, 3.10.x ``swift.llm.train.rlhf``, 4.x ``swift.pipelines.train.rlhf``) and,
for the teacher only:

1. preflight, before anything of the teacher is read but its ``config.json``:
   parameters x dtype bytes, per rank under the placement the load will really use
   (whole model, or /world_size when partitioned; 0 on the device with ZeRO-3
   parameter offload), against the device's free memory
   (``shim.deepspeed_teacher``). Too big: ONE ``TeacherWontFit`` error naming the
   numbers and the fixes. It runs whether or not step 2 applies, so the user is
   told about a teacher that cannot fit even partitioned;
2. when the teacher's config is ZeRO-3 and the global one is not: the load runs
   under a temporary ZeRO-3 ``HfTrainerDeepSpeedConfig`` from the teacher's config
   ("auto" values from the student's ``training_args``), so ``from_pretrained``
   partitions it under ``zero.Init`` with no per-rank ``device_map`` (ms-swift's
   ``get_default_device_map`` returns None under ZeRO-3); the student's global is
   restored right after, even on error.

Stands down (probe, on the code of ``_prepare_single_model``) where it already
builds a DeepSpeed config or ``zero.Init`` context for the teacher itself, or
where the code no longer has the shape above.
"""
from shim.patching import Patch

ID = "swift-gkd-teacher-zero3"
_ALREADY = ("HfTrainerDeepSpeedConfig", "HfDeepSpeedConfig", "zero.Init", "set_hf_deepspeed_config",
            "enable_deepspeed_zero3", "deepspeed_zero3_context")
_EXPECTED = ("disable_deepspeed_zero3", "teacher_deepspeed", "get_model_processor", "'teacher'")


def _probe(module):
    import inspect

    cls = getattr(module, "SwiftRLHF", None)
    func = getattr(cls, "_prepare_single_model", None) if cls is not None else None
    if func is None:
        return "upstream shape changed: no SwiftRLHF._prepare_single_model"
    try:
        source = inspect.getsource(func)
        params = list(inspect.signature(func).parameters)
    except (OSError, TypeError, ValueError) as exc:
        return f"upstream shape changed: source not readable ({exc})"
    if any(token in source for token in _ALREADY):
        return "ms-swift already loads a ZeRO-3 teacher under its own config"
    missing = [t for t in _EXPECTED if t not in source]
    if missing or params[:2] != ["self", "key"]:
        return f"upstream shape changed: _prepare_single_model lacks {', '.join(missing) or 'key'}"
    return None


def _make_apply(patch_id):
    return lambda module, patcher: _apply(module, patcher, patch_id)


def _apply(module, patcher, ID):
    import inspect

    from shim import deepspeed_teacher as dt
    from shim import log

    cls = module.SwiftRLHF
    signature = inspect.signature(cls._prepare_single_model)

    def plan(rlhf, bound):
        """-> (zero3 load?, preflight Estimate or None, message context)."""
        import transformers.integrations.deepspeed as hf_ds

        args = rlhf.args
        teacher_ds = getattr(args, "teacher_deepspeed", None)
        teacher_ds = teacher_ds if isinstance(teacher_ds, dict) else None
        teacher_stage = dt.zero_stage(teacher_ds)
        student_ds = getattr(args, "deepspeed", None)
        student_stage = dt.zero_stage(student_ds)
        global_z3 = hf_ds.is_deepspeed_zero3_enabled()
        training_args = getattr(args, "training_args", None)
        why_not = None
        if teacher_stage == 3 and not global_z3:
            if getattr(args, "device_map", None):
                why_not = "--device_map is set (ZeRO-3 loading takes no device_map)"
            elif getattr(args, "quant_method", None) or getattr(args, "quant_bits", None):
                why_not = "the teacher is quantized at load (transformers skips zero.Init)"
            elif training_args is None or getattr(training_args, "hf_deepspeed_config", None) is None:
                why_not = "no DeepSpeed training arguments"
        zero3_load = teacher_stage == 3 and not global_z3 and why_not is None
        if teacher_ds is not None and teacher_stage != 3:
            partitioned, offload = False, False  # ms-swift loads it under disable_deepspeed_zero3()
        elif zero3_load:
            partitioned, offload = True, dt.zero3_offloads_params(teacher_ds)
        else:  # under the global (student's) config
            partitioned = global_z3
            offload = partitioned and dt.zero3_offloads_params(hf_ds.deepspeed_config())
        ctx = dict(student_stage=student_stage, teacher_stage=teacher_stage, why_not=why_not,
                   teacher_ds=teacher_ds, training_args=training_args)
        return zero3_load, partitioned, offload, ctx

    def teacher_config(rlhf, bound):
        import os

        args = rlhf.args
        model = getattr(args, "teacher_model", None)
        if isinstance(model, (list, tuple)):
            model = model[0] if model else None
        if not model:
            return None, None
        model_dir = model
        if not os.path.isdir(model_dir):  # a hub id: the same config-only download ms-swift does next
            download = getattr(module, "safe_snapshot_download", None)
            if download is None:
                return model, None
            model_dir = download(model_id_or_path=model, revision=bound.arguments.get("model_revision"),
                                 download_model=False, use_hf=getattr(args, "use_hf", None),
                                 hub_token=getattr(args, "hub_token", None))
        return model, dt.read_config(model_dir)

    def wrapper(wrapped, instance, args, kwargs):
        if instance is None:
            return wrapped(*args, **kwargs)
        try:
            bound = signature.bind(instance, *args, **kwargs)
            if bound.arguments.get("key") != "teacher" or getattr(instance.args, "teacher_model", None) is None:
                return wrapped(*args, **kwargs)
            zero3_load, partitioned, offload, ctx = plan(instance, bound)
        except Exception as exc:  # our own planning failed: ms-swift's behaviour, one warning
            log.warning(f"{ID}: teacher load left to ms-swift ({type(exc).__name__}: {exc})")
            return wrapped(*args, **kwargs)
        est, skipped = None, "preflight skipped: no config.json"
        try:
            model, config = teacher_config(instance, bound)
            if config is not None:
                est = dt.estimate(config, dtype=getattr(instance.args, "torch_dtype", None),
                                  partitioned=partitioned, offload_params=offload)
        except Exception as exc:  # an unusual config: no preflight, the load itself is unchanged
            skipped = f"preflight skipped ({type(exc).__name__}: {exc})"
        if est is not None and not est.fits:
            raise dt.TeacherWontFit(dt.wont_fit_message(
                est, model=model, student_stage=ctx["student_stage"], teacher_stage=ctx["teacher_stage"],
                server_option=hasattr(instance.args, "teacher_model_server"), patch_id=ID))
        preflight = est.text() if est is not None else skipped
        if not zero3_load:
            extra = f" ({ctx['why_not']})" if ctx["why_not"] else ""
            log.decision(f"{ID}: teacher loads under ms-swift's placement{extra}; {preflight}")
            return wrapped(*args, **kwargs)
        log.decision(f"{ID}: teacher loads partitioned under its ZeRO-3 config "
                     f"(student zero{ctx['student_stage']}); {preflight}")
        with dt.zero3_load_context(ctx["teacher_ds"], ctx["training_args"]):
            return wrapped(*args, **kwargs)

    patcher.wrap(cls, "_prepare_single_model", wrapper)


_COMMON = dict(
    issue="modelscope/ms-swift#6639",
    distribution="ms-swift",
    probe=_probe,
    summary="GKD teacher with --teacher_deepspeed zero3 loads partitioned (zero.Init) under a non-ZeRO-3 "
            "student; memory preflight from config.json fails fast",
    verified="CPU: real ms-swift 3.10.0/3.10.1/4.6.0 SwiftRLHF, deepspeed 0.19.8: ZeRO-3 on during the "
             "teacher load with the shim, off without; 235B-A22B-shaped config on 8x80 GB fails fast",
)

PATCH_3_10 = Patch(id=ID, affected=">=3.10.0,<4.0.0", module="swift.llm.train.rlhf", apply=_make_apply(ID),
                   **_COMMON)
PATCH_4 = Patch(id=ID + "-4x", affected=">=4.0.0", module="swift.pipelines.train.rlhf",
                apply=_make_apply(ID + "-4x"), **_COMMON)
PATCHES = [PATCH_3_10, PATCH_4]
