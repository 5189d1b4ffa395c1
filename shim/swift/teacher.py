"""ms-swift GKD: how the teacher is loaded (plan, memory preflight, ZeRO-3 load context).

The behaviour behind the ``swift-gkd-teacher-zero3`` patches (``patches/swift_gkd_teacher_zero3.py``
binds it to ``SwiftRLHF._prepare_single_model`` of 3.10.x ``swift.llm.train.rlhf`` and 4.x
``swift.pipelines.train.rlhf``). For the teacher only: a preflight from ``config.json`` (too big:
one ``TeacherWontFit``), then, when the teacher's DeepSpeed config is ZeRO-3 and the global one is
not, the load under a temporary ZeRO-3 config (``shim.deepspeed.teacher.zero3_load_context``), so it
is partitioned as it loads; the student's config is restored right after, even on error.
"""
from __future__ import annotations


def load_wrapper(module, patch_id: str):
    """The ``wrapt`` wrapper for ``module.SwiftRLHF._prepare_single_model``."""
    import inspect

    from shim.deepspeed import teacher as dt
    from shim.engine import log

    ID = patch_id
    signature = inspect.signature(module.SwiftRLHF._prepare_single_model)

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

    return wrapper
