"""Self-tests of the fake vLLM's semantics.  Every scenario runs in a new
process because the fake reads its configuration (and the device its
allocator settings) once per process: a warm child (``tests/support/warm.py``:
a fork of a server that imported torch and a few more, none of them the fake's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import warm
from tests.support.helpers import child_text

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
CHILDREN = Path(HERE) / "children"  # each a body that runs after children/prelude.py
PRELUDE = (CHILDREN / "prelude.py").read_text()
MOE = CHILDREN / "moe.py"
MLA_BODY = CHILDREN / "mla.py"
LEVEL1_ROUNDTRIP_PRESERVES_WEIGHTS = CHILDREN / "level1_roundtrip_preserves_weights.py"
LEVEL2_WAKE_IS_GARBAGE_AND_RELOAD_RESTORES = CHILDREN / "level2_wake_is_garbage_and_reload_restores.py"
LEVEL2_KEEPS_BUFFERS = CHILDREN / "level2_keeps_buffers.py"
LOAD_WEIGHTS_WRITES_AND_LOST_WHILE_ASLEEP_CUDA = CHILDREN / "load_weights_writes_and_lost_while_asleep_cuda.py"
EXECUTOR_GUARDS = CHILDREN / "executor_guards.py"
GENERATE_OUTPUTS_SHAPE_AND_LOGPROBS = CHILDREN / "generate_outputs_shape_and_logprobs.py"
DIST_INFO_VERSION = CHILDREN / "dist_info_version.py"
NPU_MODE_ERRORS = CHILDREN / "npu_mode_errors.py"
LORA_SLOTS_FOLLOW_THE_WEIGHTS_TAG = CHILDREN / "lora_slots_follow_the_weights_tag.py"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    sys.path.insert(0, TESTS)
    import tiny
    return tiny.make_tiny_model(str(d / "m"), seed=0)


def run(model_dir, body, env: dict | None = None, expect_rc: int = 0) -> dict:
    """RESULT of ``PRELUDE`` + ``body``: a child file, several in order (a tuple), or an inline snippet."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("FAKEVLLM_", "PYTORCH_"))}
    e["PYTHONPATH"] = os.pathsep.join([HERE, e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["VLLM_LOGGING_LEVEL"] = "ERROR"
    e.update(env or {})
    code = PRELUDE + child_text(body) + "\nprint('RESULT=' + json.dumps(RESULT))\n"
    p = warm.run(sys.executable, ["-c", code, model_dir], e, os.path.dirname(model_dir), 300)  # warm child (fork)
    assert p.returncode == expect_rc, p.stdout[-3000:] + p.stderr[-3000:]
    for line in p.stdout.splitlines():
        if line.startswith("RESULT="):
            return json.loads(line[7:])
    return {"stderr": p.stderr}


def test_level1_roundtrip_preserves_weights(model_dir):
    r = run(model_dir, LEVEL1_ROUNDTRIP_PRESERVES_WEIGHTS)
    assert r["freed"] > 30 * 2**30 and r["sleeping"] and r["gen_asleep"] != "ok"
    assert r["same_fp"] and r["same_toks"]


def test_level2_wake_is_garbage_and_reload_restores(model_dir):
    r = run(model_dir, LEVEL2_WAKE_IS_GARBAGE_AND_RELOAD_RESTORES)
    assert r["garbage"] and r["garbage_toks_differ"] and r["origin"] == "garbage"
    assert r["restored"] and r["is_ckpt"] == [True, False, True]


def test_level2_keeps_buffers(model_dir):
    r = run(model_dir, LEVEL2_KEEPS_BUFFERS)
    assert r["n"] >= 1 and r["same"]


def test_load_weights_writes_and_lost_while_asleep_cuda(model_dir):
    r = run(model_dir, LOAD_WEIGHTS_WRITES_AND_LOST_WHILE_ASLEEP_CUDA)
    assert r["loaded"] > 0 and r["written"] and r["lost"] and r["unknown"] == "KeyError"


def test_executor_guards(model_dir):
    r = run(model_dir, EXECUTOR_GUARDS)
    assert r["second_sleep_noop"]
    assert r["after_weights"] == ["kv_cache"] and r["after_both"] == ["kv_cache"] and not r["kv_mapped"]
    assert r["awake"]
    assert r["guards"] == ["Executor is already sleeping.", "Tag weights is not in sleeping tags ['kv_cache']",
                           "Executor is not sleeping."]
    assert r["rpc"] == "Method 'definitely_missing' is not implemented."


def test_generate_outputs_shape_and_logprobs(model_dir):
    r = run(model_dir, GENERATE_OUTPUTS_SHAPE_AND_LOGPROBS)
    assert r["n"] == [2, 2] and r["prompt_ids"] == [3, 10, 11] and r["lens"] and r["sampled_in"]
    assert r["ranks"][0] == 1 and r["finite"] and r["seeded"] and r["chat"]


def test_dist_info_version(model_dir):
    r = run(model_dir, DIST_INFO_VERSION)
    assert r == {"v": "0.24.0", "attr": "0.24.0", "ascend": False, "dt": "cuda", "cuda_avail": False}


def test_make_site_other_version(model_dir, tmp_path):
    sys.path.insert(0, HERE)
    import make_site
    site = make_site.make_site(str(tmp_path / "site"), version="0.10.2")
    env = {"PYTHONPATH": site, "FAKEVLLM_VERSION": "0.10.2"}
    p = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, vllm; "
                        "from vllm.sampling_params import GuidedDecodingParams; "
                        "print(m.version('vllm'), vllm.__version__)"],
                       env={**os.environ, **env}, capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0.10.2", "0.10.2"]
    # mismatch is refused
    p = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": site, "FAKEVLLM_VERSION": "0.24.0"})
    assert p.returncode != 0 and "make_site" in p.stderr


def test_npu_mode_errors(model_dir):
    r = run(model_dir, NPU_MODE_ERRORS, env={"FAKEVLLM_DEVICE": "npu"})
    assert r["dt"] == "npu"
    assert r["reload"] == "Method 'reload_weights' is not implemented."
    assert r["write"] == "The DDR address of the MTE instruction is out of range"
    assert r["alloc"] == "CaMemAllocator"


def test_npu_reload_from_ascend_0_24(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        llm.collective_rpc("reload_weights"); RESULT["ok"] = True
    """, env={"FAKEVLLM_DEVICE": "npu", "FAKEVLLM_ASCEND_VERSION": "0.24.0rc1"})
    assert r["ok"]


def test_npu_env_assert(model_dir):
    run(model_dir, "new_llm()", env={"FAKEVLLM_DEVICE": "npu",
                                    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, expect_rc=1)


def _freed(model_dir, env, setup="", after=""):
    """children/sleep_freed.py, ``setup`` before the first device use and ``after`` after it (one-liners)."""
    return run(model_dir, CHILDREN / "sleep_freed.py", env={**env, "TEST_SETUP": setup, "TEST_AFTER": after})


@pytest.mark.parametrize("case,env,setup,after,bypass", [
    ("npu env rewritten after torch_npu init", {"FAKEVLLM_DEVICE": "npu",
     "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, "",
     "os.environ['PYTORCH_NPU_ALLOC_CONF'] = 'expandable_segments:False'", True),
    ("npu live setting", {"FAKEVLLM_DEVICE": "npu"}, "", "torch.npu.memory._set_allocator_settings('expandable_segments:True')", True),
    ("npu plain", {"FAKEVLLM_DEVICE": "npu"}, "", "", False),
    ("old torch, PYTORCH_ALLOC_CONF", {"FAKEVLLM_TORCH": "old", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "", "", True),
    ("old torch, live setting", {"FAKEVLLM_TORCH": "old"}, "", "torch.cuda.memory._set_allocator_settings('expandable_segments:True')", True),
    ("old torch, PYTORCH_CUDA_ALLOC_CONF (vLLM toggles it off)", {"FAKEVLLM_TORCH": "old",
     "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "", "", False),
    ("modern torch, PYTORCH_ALLOC_CONF", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "", "", False),
    ("modern torch, live", {}, "", "torch.cuda.memory._set_allocator_settings('expandable_segments:True')", False),
    ("old torch, vLLM 0.33 sees live setting", {"FAKEVLLM_TORCH": "old", "FAKEVLLM_VERSION": "0.33.0",
     "PYTHONPATH": "SITE033"}, "", "torch.cuda.memory._set_allocator_settings('expandable_segments:True')", False),
])
def test_bypass(model_dir, tmp_path, case, env, setup, after, bypass):
    env = dict(env)
    if env.get("PYTHONPATH") == "SITE033":
        sys.path.insert(0, HERE)
        import make_site
        env["PYTHONPATH"] = make_site.make_site(str(tmp_path / "s033"), version="0.33.0")
    r = _freed(model_dir, env, setup, after)
    if bypass:
        assert r["freed_gib"] < 0.01 and r["pool"] == 0, (case, r)
    else:
        assert r["freed_gib"] > 30 and r["pool"] > 0, (case, r)


def test_allocator_settings_write_resets_like_torch(model_dir):
    """torch's CUDA ``parseArgs`` (c10/core/AllocatorConfig.cpp) puts max_split_size_mb,
    roundup_power2_divisions and garbage_collection_threshold back to their defaults before each parse:
    a live write that does not name them drops the user's values; other options keep theirs."""
    r = run(model_dir, """
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        RESULT["s"] = torch.cuda.memory._fakevllm_get_allocator_settings()
        RESULT["last"] = dev.last_conf
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,pinned_use_cuda_host_register:True,"
                                        "expandable_segments:False"})
    assert r["s"] == "pinned_use_cuda_host_register:True,expandable_segments:True"
    assert r["last"] == "expandable_segments:True"


def test_old_vllm_asserts_on_cuda_conf(model_dir, tmp_path):
    sys.path.insert(0, HERE)
    import make_site
    site = make_site.make_site(str(tmp_path / "s020"), version="0.20.0")
    run(model_dir, "new_llm()", env={"PYTHONPATH": site, "FAKEVLLM_VERSION": "0.20.0",
                                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, expect_rc=1)


def test_events_jsonl(model_dir, tmp_path):
    path = tmp_path / "ev.jsonl"
    run(model_dir, """
        llm = new_llm(); toks(llm); llm.sleep(level=1); llm.wake_up(); toks(llm)
    """, env={"FAKEVLLM_EVENTS": str(path)})
    recs = [json.loads(l) for l in path.read_text().splitlines()]
    kinds = [r["event"] for r in recs]
    assert kinds.count("generate") == 2 and "sleep" in kinds and "wake_up" in kinds
    assert all("weights_fp" in r for r in recs if r["event"] == "generate")


def test_lora_slots_follow_the_weights_tag(model_dir, tmp_path):
    """vLLM 0.10.2 LoRA: linear layers become LoRA layers (``base_layer`` names), ``add_lora`` loads an adapter
    from ``lora_path`` into a GPU slot, the request's adapter is applied at generate; the slots are memory of the
    weights tag: kept by a level-1 sleep, discarded by a level-2 sleep while the adapter stays registered."""
    r = run(model_dir, LORA_SLOTS_FOLLOW_THE_WEIGHTS_TAG, env={"TEST_ADAPTER_DIR": str(tmp_path / "adapter")})
    assert r["base_layer"] and r["added"] and r["listed"] == [7] and r["listed_l2"] == [7]
    assert r["diff"] < 1e-6 and r["diff_l1"] < 1e-6 and r["diff_l2"] > 0.1 and r["differs"], r


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-moe")
    sys.path.insert(0, TESTS)
    import tiny
    return tiny.make_tiny_moe_model(str(d / "m"), seed=0)


@pytest.mark.parametrize("device,ascend", [("cuda", ""), ("npu", "0.23.0"), ("npu", "0.26.0rc1")])
def test_moe_fused_experts(moe_dir, device, ascend):
    """vLLM's fused experts (w13_weight [E, 2I, H], w2_weight [E, H, I]) compute what transformers' experts
    compute; in NPU mode vllm-ascend's process_weights_after_loading re-lays them ([E, H, 2I], [E, I, H]),
    dropping the Parameter (and its weight_loader) up to 0.25.1rc1, so a per-tensor push of the experts
    fails there; on CUDA the push lands."""
    r = run(moe_dir, MOE, env={"FAKEVLLM_DEVICE": device, **({"FAKEVLLM_ASCEND_VERSION": ascend} if ascend else {})})
    assert r["tokens"] == r["hf"]
    w13, w2 = (r["params"][f"model.layers.0.mlp.experts.{n}"] for n in ("w13_weight", "w2_weight"))
    if device == "cuda":
        assert (w13, w2) == ([4, 48, 32], [4, 32, 24]) and r["loader"] is True and r["pushed"] is True
    else:
        assert (w13, w2) == ([4, 32, 48], [4, 24, 32])
        assert r["loader"] is (ascend == "0.26.0rc1")
        if ascend == "0.23.0":
            assert "AttributeError" in r["push_error"] and "weight_loader" in r["push_error"]
# ---------------------------------------------------------------------------
# MLA (DeepSeek-V2): derived matrices, decode through them, the layerwise reload
# ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def mla_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla")
    sys.path.insert(0, TESTS)
    import tiny
    return tiny.make_tiny_mla_model(str(d / "m"), seed=0)


def make_site_dir(tmp_path, version: str) -> str:
    sys.path.insert(0, HERE)
    import make_site
    return make_site.make_site(str(tmp_path / f"s{version}"), version=version)


@pytest.mark.parametrize("version,preserve,draft_kept,target_kept", [
    ("0.33.0", "", False, False),
    ("0.33.0", "draft.*", True, False),
    ("0.34.0", "", False, False),
    ("0.34.0", "draft.*", True, False),
    ("0.34.0", "draft.*,model.*,lm_head.*", True, True),
])
def test_level2_033_034(model_dir, tmp_path, version, preserve, draft_kept, target_kept):
    """Level 2 with a drafter: its parameters are discarded like the target's (vllm#52479) unless
    ``sleep_preserve_parameter_names`` names them (0.33: host copies restored at the weights wake; 0.34: their
    allocations offloaded instead of discarded). The buffers come back in both; 0.34 saves none itself
    (``_sleep_saved_buffers`` gone, ``_discardable_parameters`` instead)."""
    site = make_site_dir(tmp_path, version)
    r = run(model_dir, CHILDREN / "level2_drafter_and_preserve.py",
            env={"PYTHONPATH": site, "FAKEVLLM_VERSION": version, "TEST_PRESERVE": preserve})
    assert (r["draft_kept"], r["target_kept"], r["buffers_kept"]) == (draft_kept, target_kept, True), r
    assert (r["saved_buffers_attr"], r["discardable_method"]) == ((False, True) if version == "0.34.0" else (True, False))


def test_mla_unquantized_derives_views(mla_dir):
    """vLLM 0.24 ``get_and_maybe_dequant_weights``: the weight itself -> W_UV a view; a raw push is seen."""
    r = run(mla_dir, MLA_BODY)
    assert r["n_mla"] == 2 and r["view"] is True
    assert r["raw_derived_follow"] is True and r["raw"] == r["reloaded"]


def test_mla_quantized_derives_copies_in_the_pool(mla_dir):
    """Quantized kv_b_proj: own copies in the weights pool; a raw push leaves them stale (decode differs
    from the reload, prefill's first token does not); reload_weights re-derives them OUTSIDE the pool."""
    r = run(mla_dir, MLA_BODY, env={"FAKEVLLM_QUANTIZATION": "fp8"})
    assert r["view"] is False and r["derived_in_pool"] is True
    assert r["raw_derived_follow"] is False and r["reload_derived_follow"] is True
    assert r["raw"] != r["reloaded"] and r["raw"][0] == r["reloaded"][0]
    assert r["reload_derived_in_pool"] is False


def test_mla_below_016_impl_and_no_layerwise(mla_dir, tmp_path):
    """<= 0.15: the matrices on ``layer.impl``; no ``model_loader.reload`` module."""
    site = make_site_dir(tmp_path, "0.15.1")
    r = run(mla_dir, (MLA_BODY, CHILDREN / "mla_impl.py"),
            env={"FAKEVLLM_QUANTIZATION": "fp8", "FAKEVLLM_VERSION": "0.15.1",
                 "PYTHONPATH": site})
    assert r["reload_module"] is False and r["on_impl"] is True and r["raw_derived_follow"] is False


def test_layerwise_reload_per_tensor_corrupts_split_layers(mla_dir):
    """One reload per tensor finalizes a layer loaded in part: the elements not loaded are garbage
    (SkyRL#1680 / #1737: vLLM materialises the layer with torch.empty)."""
    r = run(mla_dir, CHILDREN / "layerwise_per_tensor.py")
    assert r["one_reload"] is True and r["per_tensor"] is False
