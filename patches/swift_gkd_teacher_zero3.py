"""ms-swift GKD: a ZeRO-3 teacher is loaded whole on every rank under a non-ZeRO-3 student.

Upstream: modelscope/ms-swift#6639 (OOM at 31% of the teacher checkpoint; workaround #6413)
Affects:  ms-swift >=3.10.0,<4.0.0 (swift.llm.train.rlhf) and >=4.0.0 (-4x, swift.pipelines.train.rlhf);
          3.10.1+ builds the real teacher class, 3.10.0 the student's;
          with --teacher_deepspeed zero3 and a --deepspeed that is not ZeRO-3 (zero0/1/2, none)
Remove:   when ms-swift loads a ZeRO-3 teacher under its own config (the probe sees it)

``SwiftRLHF._prepare_single_model('teacher', ...)`` loads the teacher under transformers' process-global
DeepSpeed config, which is the student's: a ZeRO-2 student loads the whole teacher onto every rank
(``device_map=cuda:N``), and ``--teacher_deepspeed zero3`` partitions it only afterwards, in
``prepare_deepspeed``. ``shim.swift.teacher.load_wrapper`` loads it partitioned (the record says how).
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, params, source

ID = "swift-gkd-teacher-zero3"
_ALREADY = ("HfTrainerDeepSpeedConfig", "HfDeepSpeedConfig", "zero.Init", "set_hf_deepspeed_config",
            "enable_deepspeed_zero3", "deepspeed_zero3_context")
_EXPECTED = ("disable_deepspeed_zero3", "teacher_deepspeed", "get_model_processor", "'teacher'")


def _probe(module):
    func = getattr(getattr(module, "SwiftRLHF", None), "_prepare_single_model", None)
    if func is None:
        return changed("no SwiftRLHF._prepare_single_model")
    text, reason = source(func, "SwiftRLHF._prepare_single_model")
    if reason:
        return reason
    names, reason = params(func, "SwiftRLHF._prepare_single_model")
    if reason:
        return reason
    if any(token in text for token in _ALREADY):
        return "ms-swift already loads a ZeRO-3 teacher under its own config"
    missing = [t for t in _EXPECTED if t not in text]
    if missing or names[:2] != ["self", "key"]:
        return changed(f"_prepare_single_model lacks {', '.join(missing) or 'key'}")
    return None


def apply(module, patcher):
    from shim.swift import teacher

    patcher.wrap(module.SwiftRLHF, "_prepare_single_model", teacher.load_wrapper(module, patcher.patch_id))


PATCH_3_10 = Patch(
    id=ID,
    tested_at=("swift", "3.10.1"),
    issue="modelscope/ms-swift#6639",
    distribution="ms-swift",
    affected=">=3.10.0,<4.0.0",
    module="swift.llm.train.rlhf",
    apply=apply,
    probe=_probe,
    summary="GKD teacher with --teacher_deepspeed zero3 loads partitioned (zero.Init) under a non-ZeRO-3 "
            "student; memory preflight from config.json fails fast",
    verified=("CPU: real ms-swift 3.10.0/3.10.1/4.6.0 `SwiftRLHF` and deepspeed 0.19.8: ZeRO-3 on during the "
              "teacher load with the shim, off without (asserted), student config restored; Qwen3-VL-235B-A22B / "
              "Qwen3-235B-A22B configs with no weights on 8 x 80 GB under a ZeRO-2 student fail fast with only "
              "`config.json` opened; a small teacher passes"),
    changes=("`SwiftRLHF._prepare_single_model` for the teacher: a preflight from `config.json` only (parameters x "
             "dtype bytes per rank under the real placement vs free device memory) stops a teacher that cannot fit "
             "with one error giving the numbers and fixes, before any weight is read; the teacher then loads under "
             "a temporary ZeRO-3 config built from `--teacher_deepspeed` (\"auto\" values from the student's "
             "training arguments), so it is partitioned as it loads (`zero.Init`, no per-rank `device_map`); the "
             "student's config is restored right after. Stands down where ms-swift builds its own DeepSpeed config "
             "for the teacher. The preflight (`shim.deepspeed.teacher`) counts 0 bytes on the device with ZeRO-3 "
             "parameter offload and runs whether or not the ZeRO-3 load applies, so a teacher that cannot fit even "
             "partitioned is told (`TeacherWontFit`); under ZeRO-3 ms-swift's `get_default_device_map` returns "
             "None; the student's global config is restored even on error. The probe reads `_prepare_single_model` "
             "(the class attribute of the concrete module) and stands down where it builds a DeepSpeed config or "
             "`zero.Init` context for the teacher itself or no longer has the shape above."),
)
PATCH_4 = PATCH_3_10.like(id=ID + "-4x", affected=">=4.0.0", module="swift.pipelines.train.rlhf",
                          tested_at=("swift", "4.6.0"))
PATCHES = [PATCH_3_10, PATCH_4]
