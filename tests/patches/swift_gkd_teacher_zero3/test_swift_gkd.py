"""ms-swift GKD teacher under ZeRO-3 (#6639) and the memory preflight, on the REAL code.

Each case runs in a fresh interpreter of the ms-swift venv (tests/support/swift_envs.py,
real ms-swift, transformers, deepspeed 0.19.8 on CPU, gloo, one rank), with the
working tree on PYTHONPATH. The child builds ``RLHFArguments`` (rlhf_type=gkd,
student ``--deepspeed zero2``) and ``SwiftRLHF(args)``, which loads the student and
the teacher through ms-swift's own ``_prepare_single_model``. It records, at every
``PreTrainedModel.from_pretrained``, whether transformers sees ZeRO-3 and the
``device_map``, and every file opened under the teacher's directory (audit hook).

The device is the seam of ``shim.deepspeed.teacher`` (``device_memory`` /
``world_size``): 8 ranks of 80 GB. Teachers: a tiny random Qwen2 (real weights), and
235B-A22B-shaped configs (Qwen3-VL-235B-A22B, Qwen3-235B-A22B) written as a bare
config.json, no weights at all.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import swift_envs
from tests.support.helpers import (
    REPO,  # noqa: E402
    rendezvous_port,
)

# 3.10.0 differs from 3.10.1 only in the teacher's model_type detection; SWIFT_GKD_VERSIONS adds it (CI time)
VERSIONS = [v for v in os.environ.get("SWIFT_GKD_VERSIONS", "3.10.1,4.6.0").split(",") if v]
GB = 10**9

CHILD = Path(__file__).parent / "children" / "gkd_pipeline.py"

QWEN3_MOE_235B_TEXT = {
    "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
    "head_dim": 128, "vocab_size": 151936, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "attention_bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
}
QWEN3_MOE_235B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "torch_dtype": "bfloat16", **QWEN3_MOE_235B_TEXT}
QWEN3_VL_235B = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": False,
    "text_config": {"model_type": "qwen3_vl_moe_text", "dtype": "bfloat16", **QWEN3_MOE_235B_TEXT},
    "vision_config": {"model_type": "qwen3_vl_moe", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_channels": 3, "deepstack_visual_indexes": [8, 16, 24],
                      "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh"},
}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gkd")
    py = swift_envs.swift_python("4.6.0")  # any swift venv can write the tiny checkpoints
    code = ("import sys; sys.path.insert(0, %r); from tests.tiny import make_tiny_model; "
            "make_tiny_model(%r); make_tiny_model(%r, seed=1)") % (str(REPO), str(root / "student"),
                                                                    str(root / "teacher"))
    subprocess.run([str(py), "-c", code], check=True, capture_output=True, timeout=600)
    for name, cfg in (("qwen3-vl-235b-a22b", QWEN3_VL_235B), ("qwen3-moe-235b-a22b", QWEN3_MOE_235B)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    (root / "data.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}) + "\n")
    return root


def run_child(version, models, *, teacher="teacher", teacher_ds="zero3", shim=True, world=8, free_gb=80,
              teacher_type="qwen2", fail_teacher=False, dtype="float32"):
    port = rendezvous_port()
    spec = {"student": str(models / "student"), "teacher": str(models / teacher), "data": str(models / "data.jsonl"),
            "out": str(models / f"out-{os.getpid()}-{port}"), "teacher_ds": teacher_ds, "shim": shim,
            "world": world, "free": free_gb * GB, "teacher_type": teacher_type, "fail_teacher": fail_teacher,
            "dtype": dtype}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIM_", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(swift_envs.swift_python(version)), "-c", CHILD.read_text(), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(models))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), proc.stderr
    raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}")


def _teacher_loads(result, models, teacher="teacher"):
    return [x for x in result["loads"] if x["path"] == str(models / teacher)]


@pytest.mark.parametrize("version", VERSIONS)
def test_teacher_loads_partitioned_with_shim(version, models):
    result, err = run_child(version, models)
    assert result["error"] is None, (result, err[-3000:])
    (teacher,) = _teacher_loads(result, models)
    student = [x for x in result["loads"] if x["path"] == str(models / "student")]
    assert teacher["zero3"] is True and teacher["device_map"] == "None"
    assert student and all(x["zero3"] is False for x in student)
    assert result["teacher_partitioned"] is True and result["teacher_ds_numel"] > 0
    # the student's global config is back
    assert result["after_zero3"] is False and result["after_is_student"] is True and result["after_stage"] == 2
    assert "teacher loads partitioned under its ZeRO-3 config (student zero2)" in err
    assert "partitioned over 8 ranks" in err  # the preflight ran on the partitioned size and passed
    suffix = "-4x" if version.startswith("4.") else ""
    assert f"swift-gkd-teacher-zero3{suffix} (modelscope/ms-swift#6639, ms-swift {version}): applied" in err


def test_student_config_restored_when_teacher_load_fails(models):
    """A fault inside the teacher load (OOM, a bad shard) reaches the caller unchanged, and the student's
    DeepSpeed config is back all the same (restored in ``finally``, not only on success): the temporary
    ZeRO-3 config must not leak into the student's training."""
    result, err = run_child("3.10.1", models, fail_teacher=True)  # one release: the restore is the shim's own
    assert result["error"] == ["RuntimeError", "teacher load failed"], (result, err[-3000:])
    (teacher,) = _teacher_loads(result, models)
    assert teacher["zero3"] is True  # it failed inside the shim's temporary ZeRO-3 config
    assert result["after_zero3"] is False and result["after_is_student"] is True and result["after_stage"] == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_teacher_loads_whole_without_shim(version, models):
    result, err = run_child(version, models, shim=False)
    assert result["error"] is None, (result, err[-3000:])
    (teacher,) = _teacher_loads(result, models)
    assert teacher["zero3"] is False and teacher["device_map"] == "cpu"  # the bug: whole, per-rank device
    assert result["teacher_partitioned"] is False
    assert result["after_zero3"] is False and result["after_is_student"] is True
    assert "[shim]" not in err


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("teacher,teacher_type", [("qwen3-vl-235b-a22b", "qwen3_vl_moe"),
                                                  ("qwen3-moe-235b-a22b", "qwen3_moe")])
def test_preflight_235b_whole_per_rank_fails_fast(version, models, teacher, teacher_type):
    """ZeRO-2 student, teacher placement not partitioned (teacher_deepspeed zero2): 471 GB per rank."""
    if (teacher == "qwen3-vl-235b-a22b") != (version == "3.10.1") and version in ("3.10.1", "4.6.0"):
        pytest.skip("each shape on one release (CI time): Qwen3-VL on 3.10.1, Qwen3-MoE on 4.6.0")
    result, err = run_child(version, models, teacher=teacher, teacher_ds="zero2", teacher_type=teacher_type)
    assert result["error"] is not None and result["error"][0] == "TeacherWontFit", (result, err[-3000:])
    msg = result["error"][1]
    assert "whole on every rank" in msg and "80.0 GB free" in msg and "GB per rank" in msg
    assert "--deepspeed zero3 or --deepspeed zero3_offload" in msg and "teacher_model_server" in msg
    assert "--teacher_deepspeed zero3 (with the shim the teacher then loads partitioned" in msg
    assert not _teacher_loads(result, models, teacher)  # nothing of the teacher was loaded
    assert all(p.endswith("config.json") for p in result["opened"]), result["opened"]
    assert not any(f.suffix in (".safetensors", ".bin") for f in (models / teacher).iterdir())


@pytest.mark.parametrize("version", ["4.6.0"])  # the preflight is the shim's; 3.10.x's hook: the tests above
def test_preflight_235b_partitioned_checks_partitioned_size(version, models):
    """Teacher zero3 + shim, float32 (the CPU student's dtype, which ms-swift also gives the teacher):
    943 GB, 117.8 GB per rank over 8 ranks. 8 x 141 GB: the preflight lets the load go on (it then fails on
    the missing weights, not in the preflight); 8 x 80 GB: it stops first, naming zero3_offload."""
    if version not in VERSIONS:
        pytest.skip(f"{version} not selected")
    result, err = run_child(version, models, teacher="qwen3-vl-235b-a22b", teacher_type="qwen3_vl_moe",
                            free_gb=141)
    assert result["error"] is None or result["error"][0] != "TeacherWontFit", result
    assert "partitioned over 8 ranks (ZeRO-3 load): 117.8 GB per rank; 141.0 GB free" in err, err[-3000:]
    result, err = run_child(version, models, teacher="qwen3-vl-235b-a22b", teacher_type="qwen3_vl_moe")
    assert result["error"] is not None and result["error"][0] == "TeacherWontFit", result
    assert "partitioned over 8 ranks" in result["error"][1] and "zero3_offload" in result["error"][1]
    assert all(p.endswith("config.json") for p in result["opened"]), result["opened"]


@pytest.mark.parametrize("version", ["4.6.0"])
def test_preflight_235b_bf16_fits_partitioned_not_whole(version, models):
    """bf16 (``--torch_dtype bfloat16``): 471.3 GB, 58.9 GB per rank over 8 ranks of 80 GB. Partitioned (teacher
    zero3 + shim) it fits: the preflight lets the load go on (it then fails on the missing weights); whole
    (teacher zero2) 471.3 GB per rank does not: TeacherWontFit before anything of the teacher is read. The
    float32 runs above cannot tell the two placements apart at 80 GB (117.8 GB per rank even split)."""
    if version not in VERSIONS:
        pytest.skip(f"{version} not selected")
    split, err = run_child(version, models, teacher="qwen3-vl-235b-a22b", teacher_type="qwen3_vl_moe",
                           dtype="bfloat16")
    assert split["error"] is None or split["error"][0] != "TeacherWontFit", split
    assert "x 2 bytes (bfloat16)" in err and "partitioned over 8 ranks (ZeRO-3 load): 58.9 GB per rank; " \
           "80.0 GB free" in err, err[-3000:]
    whole, err = run_child(version, models, teacher="qwen3-vl-235b-a22b", teacher_type="qwen3_vl_moe",
                           dtype="bfloat16", teacher_ds="zero2")
    assert whole["error"] is not None and whole["error"][0] == "TeacherWontFit", whole
    assert "x 2 bytes (bfloat16)" in whole["error"][1] and "whole on every rank" in whole["error"][1]
    assert "80.0 GB free" in whole["error"][1]
    assert all(p.endswith("config.json") for p in whole["opened"]), whole["opened"]


def test_parameter_count_formula():
    """Units of shim.deepspeed.teacher, in this interpreter (no torch import needed)."""
    from shim.deepspeed import teacher as dt

    assert round(dt.count_parameters(QWEN3_MOE_235B) / 1e9, 1) == 235.1  # published: 235B
    assert 235.5e9 < dt.count_parameters(QWEN3_VL_235B) < 236.5e9       # + vision tower
    qwen3_8b = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "vocab_size": 151936,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False}
    assert round(dt.count_parameters(qwen3_8b) / 1e9, 1) == 8.2                # published: 8.2B
    assert dt.config_dtype(QWEN3_VL_235B) == "bfloat16" and dt.dtype_bytes("torch.bfloat16") == 2


def _module_from_source(tmp_path, name, source):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SHAPE = '''
class SwiftRLHF:
    def _prepare_single_model(self, key, origin_key, model_type, model_revision):
        args = self.args
        if key == 'teacher' and args.teacher_deepspeed:
            if args.teacher_deepspeed.get('zero_optimization', {}).get('stage') != 3:
                context = disable_deepspeed_zero3()
        %s
        return args.get_model_processor(model=None)
'''


def test_probe_expected_shape_fixed_upstream_and_changed(tmp_path):
    from shim.engine import catalog

    _probe = catalog.patch_module("swift_gkd_teacher_zero3")._probe

    assert _probe(_module_from_source(tmp_path, "m_ok", _SHAPE % "pass")) is None
    fixed = _module_from_source(tmp_path, "m_fixed", _SHAPE % "ctx = HfTrainerDeepSpeedConfig(args.teacher_deepspeed)")
    assert _probe(fixed) == "ms-swift already loads a ZeRO-3 teacher under its own config"
    changed = _module_from_source(tmp_path, "m_changed", "class SwiftRLHF:\n    def _prepare_single_model(self, key):\n"
                                                          "        return None\n")
    assert _probe(changed).startswith("upstream shape changed")
    assert _probe(_module_from_source(tmp_path, "m_none", "x = 1\n")).startswith("upstream shape changed")


def test_wont_fit_message_is_one_line_with_numbers(monkeypatch):
    from shim.deepspeed import teacher as dt

    monkeypatch.setattr(dt, "device_memory", lambda: (80 * GB, 80 * GB))
    monkeypatch.setattr(dt, "world_size", lambda: 8)
    est = dt.estimate(QWEN3_VL_235B, partitioned=False)
    assert not est.fits and est.bytes_per_param == 2 and round(est.total_bytes / GB) == 471
    msg = dt.wont_fit_message(est, model="Qwen/Qwen3-VL-235B-A22B-Instruct", student_stage=2, teacher_stage=3,
                              server_option=False)
    assert "\n" not in msg and "471.3 GB, whole on every rank: 471.3 GB per rank; 80.0 GB free of 80.0 GB" in msg
    assert "--deepspeed zero3 or --deepspeed zero3_offload" in msg and "ms-swift 4.x: --teacher_model_server" in msg
    est = dt.estimate(QWEN3_VL_235B, partitioned=True)
    assert est.fits and round(est.per_rank_bytes / GB, 1) == 58.9
    assert dt.estimate(QWEN3_VL_235B, partitioned=True, offload_params=True).per_rank_bytes == 0
