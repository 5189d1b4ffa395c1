"""Self-tests of the fake vLLM's semantics.  Every scenario runs in a fresh
subprocess because the fake reads its configuration (and the device its
allocator settings) once per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
CHILDREN = Path(HERE) / "children"  # each a body that runs after children/prelude.py
PRELUDE = (CHILDREN / "prelude.py").read_text()
MOE = CHILDREN / "moe.py"
MLA_BODY = CHILDREN / "mla.py"


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
    if isinstance(body, str):
        body = textwrap.dedent(body)
    else:
        body = "".join(Path(part).read_text() for part in ((body,) if isinstance(body, Path) else body))
    code = PRELUDE + body + "\nprint('RESULT=' + json.dumps(RESULT))\n"
    p = subprocess.run([sys.executable, "-c", code, model_dir], env=e, capture_output=True, text=True,
                       timeout=300, cwd=os.path.dirname(model_dir))
    assert p.returncode == expect_rc, p.stdout[-3000:] + p.stderr[-3000:]
    for line in p.stdout.splitlines():
        if line.startswith("RESULT="):
            return json.loads(line[7:])
    return {"stderr": p.stderr}


def test_level1_roundtrip_preserves_weights(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        fp0, t0 = wfp(llm), toks(llm)
        f0 = mem.mem_get_info()[0]
        llm.sleep(level=1)
        RESULT["freed"] = mem.mem_get_info()[0] - f0
        RESULT["sleeping"] = llm.llm_engine.is_sleeping()
        try:
            toks(llm); RESULT["gen_asleep"] = "ok"
        except RuntimeError as e:
            RESULT["gen_asleep"] = str(e)
        llm.wake_up()
        RESULT["same_fp"] = wfp(llm) == fp0
        RESULT["same_toks"] = toks(llm) == t0
    """)
    assert r["freed"] > 30 * 2**30 and r["sleeping"] and r["gen_asleep"] != "ok"
    assert r["same_fp"] and r["same_toks"]


def test_level2_wake_is_garbage_and_reload_restores(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        fp0, t0 = wfp(llm), toks(llm)
        llm.sleep(level=2); llm.wake_up()
        RESULT["garbage"] = wfp(llm) != fp0
        RESULT["garbage_toks_differ"] = toks(llm) != t0
        RESULT["origin"] = llm.llm_engine.model_executor.driver_worker.model_runner.weights_origin
        llm.collective_rpc("reload_weights")
        RESULT["restored"] = wfp(llm) == fp0 and toks(llm) == t0
        gens = [e for e in EVENTS if e["event"] == "generate"]
        RESULT["is_ckpt"] = [g["is_checkpoint"] for g in gens]
    """)
    assert r["garbage"] and r["garbage_toks_differ"] and r["origin"] == "garbage"
    assert r["restored"] and r["is_ckpt"] == [True, False, True]


def test_level2_keeps_buffers(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        b0 = {n: b.clone() for n, b in model(llm).named_buffers()}
        llm.sleep(level=2); llm.wake_up()
        RESULT["n"] = len(b0)
        RESULT["same"] = all(torch.equal(b0[n], b) for n, b in model(llm).named_buffers())
    """)
    assert r["n"] >= 1 and r["same"]


def test_load_weights_writes_and_lost_while_asleep_cuda(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        m = model(llm)
        new = [(n, torch.full_like(p, 0.01)) for n, p in m.named_parameters()]
        RESULT["loaded"] = len(m.load_weights(new))
        RESULT["written"] = wfp(llm) == fingerprint(new)
        llm.sleep(level=2)
        m.load_weights([(n, torch.full_like(p, 0.02)) for n, p in m.named_parameters()])   # lost
        llm.wake_up(tags=["weights"])
        RESULT["lost"] = wfp(llm) != fingerprint([(n, torch.full_like(p, 0.02)) for n, p in m.named_parameters()])
        try:
            m.load_weights([("nope.weight", torch.zeros(1))]); RESULT["unknown"] = "ok"
        except KeyError:
            RESULT["unknown"] = "KeyError"
    """)
    assert r["loaded"] > 0 and r["written"] and r["lost"] and r["unknown"] == "KeyError"


def test_executor_guards(model_dir):
    r = run(model_dir, """
        llm = new_llm()
        ex = llm.llm_engine.model_executor
        llm.sleep(level=1); n0 = len([e for e in EVENTS if e["event"] == "worker_sleep"])
        llm.sleep(level=2)   # warning no-op
        RESULT["second_sleep_noop"] = len([e for e in EVENTS if e["event"] == "worker_sleep"]) == n0
        llm.wake_up(tags=["weights"])
        RESULT["after_weights"] = sorted(ex.sleeping_tags)
        llm.wake_up(tags=["weights", "kv_cache"])   # weights not asleep -> wakes NOTHING
        RESULT["after_both"] = sorted(ex.sleeping_tags)
        RESULT["kv_mapped"] = ex.driver_worker.model_runner.kv_alloc.mapped
        llm.wake_up(tags=["kv_cache"])
        RESULT["awake"] = (not ex.is_sleeping) and not llm.llm_engine.is_sleeping()
        llm.wake_up()   # not sleeping -> warning no-op
        RESULT["guards"] = [e["note"] for e in EVENTS if e["event"] == "executor_guard"]
        try:
            llm.collective_rpc("definitely_missing"); RESULT["rpc"] = "ok"
        except NotImplementedError as e:
            RESULT["rpc"] = str(e)
    """)
    assert r["second_sleep_noop"]
    assert r["after_weights"] == ["kv_cache"] and r["after_both"] == ["kv_cache"] and not r["kv_mapped"]
    assert r["awake"]
    assert r["guards"] == ["Executor is already sleeping.", "Tag weights is not in sleeping tags ['kv_cache']",
                           "Executor is not sleeping."]
    assert r["rpc"] == "Method 'definitely_missing' is not implemented."


def test_generate_outputs_shape_and_logprobs(model_dir):
    r = run(model_dir, """
        llm = new_llm(logprobs_mode="processed_logprobs")
        sp = SamplingParams(n=2, max_tokens=5, temperature=0.8, top_p=0.9, top_k=50, seed=3, logprobs=2)
        outs = llm.generate([{"prompt_token_ids": [3, 10, 11]}, "the cat is"], sp, use_tqdm=False)
        o = outs[0].outputs[0]
        RESULT["n"] = [len(x.outputs) for x in outs]
        RESULT["prompt_ids"] = outs[0].prompt_token_ids
        RESULT["lens"] = len(o.token_ids) == len(o.logprobs)
        first = o.logprobs[0]
        tid = o.token_ids[0]
        RESULT["sampled_in"] = tid in first and len(first) <= 3
        RESULT["ranks"] = sorted(lp.rank for lp in first.values())[:2]
        RESULT["finite"] = all(lp.logprob <= 0 for d in o.logprobs for lp in d.values())
        again = llm.generate([{"prompt_token_ids": [3, 10, 11]}], sp, use_tqdm=False)[0].outputs[0].token_ids
        RESULT["seeded"] = again == o.token_ids
        ch = llm.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=3), use_tqdm=False)
        RESULT["chat"] = len(ch) == 1 and len(ch[0].outputs[0].token_ids) >= 1
    """)
    assert r["n"] == [2, 2] and r["prompt_ids"] == [3, 10, 11] and r["lens"] and r["sampled_in"]
    assert r["ranks"][0] == 1 and r["finite"] and r["seeded"] and r["chat"]


def test_dist_info_version(model_dir):
    r = run(model_dir, """
        import importlib.metadata as md
        RESULT["v"] = md.version("vllm"); RESULT["attr"] = vllm.__version__
        import importlib.util
        RESULT["ascend"] = importlib.util.find_spec("vllm_ascend") is not None
        from vllm.logprobs import Logprob; from vllm.sequence import Logprob as L2
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.distributed.parallel_state import get_world_group
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
        RESULT["dt"] = current_platform.device_type
        RESULT["cuda_avail"] = torch.cuda.is_available()
    """)
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
    r = run(model_dir, """
        import vllm_ascend
        from vllm.platforms import current_platform
        RESULT["dt"] = current_platform.device_type
        llm = new_llm()
        try:
            llm.collective_rpc("reload_weights"); RESULT["reload"] = "ok"
        except NotImplementedError as e:
            RESULT["reload"] = str(e)
        llm.sleep(level=2)
        m = model(llm)
        try:
            m.load_weights([(n, p.clone()) for n, p in m.named_parameters()]); RESULT["write"] = "ok"
        except RuntimeError as e:
            RESULT["write"] = str(e)
        RESULT["alloc"] = type(llm.llm_engine.model_executor.driver_worker._allocator()).__name__
    """, env={"FAKEVLLM_DEVICE": "npu"})
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


def test_allocator_settings_keep_other_keys(model_dir):
    r = run(model_dir, """
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        RESULT["s"] = torch.cuda.memory._fakevllm_get_allocator_settings()
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"})
    assert r["s"] == "max_split_size_mb:128,expandable_segments:True"


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
    r = run(model_dir, f"""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest
        from vllm._fake.lora import effective_weights
        llm = new_llm(enable_lora=True, max_lora_rank=8)
        m = model(llm)
        runner = llm.llm_engine.model_executor.driver_worker.model_runner
        RESULT["base_layer"] = any(n.endswith("q_proj.base_layer.weight") for n, _ in m.named_parameters())
        g = torch.Generator().manual_seed(1)
        adapter, expected = {{}}, {{}}
        for name, mod in m.named_modules():
            if hasattr(mod, "base_layer"):
                a = torch.randn(8, mod.input_size, generator=g) * 0.1
                b = torch.randn(mod.output_size, 8, generator=g) * 0.1
                adapter[f"base_model.model.{{name}}.lora_A.weight"] = a
                adapter[f"base_model.model.{{name}}.lora_B.weight"] = b
                expected[name + ".weight"] = mod.base_layer.weight.double() + 2.0 * b.double() @ a.double()
        d = {str(tmp_path / "adapter")!r}
        os.makedirs(d)
        save_file(adapter, os.path.join(d, "adapter_model.safetensors"))
        json.dump({{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}}, open(os.path.join(d, "adapter_config.json"), "w"))
        lr = LoRARequest("a", 7, d)
        RESULT["added"] = llm.llm_engine.add_lora(lr)
        RESULT["listed"] = sorted(llm.llm_engine.list_loras())
        def applied():
            runner.set_active_lora_for_request(lr)
            eff = effective_weights(m)
            return max(float((eff[k] - v).abs().max()) for k, v in expected.items())
        RESULT["diff"] = applied()
        RESULT["differs"] = toks(llm) != llm.generate(PROMPT, SP, use_tqdm=False, lora_request=lr)[0].outputs[0].token_ids
        llm.sleep(level=1); llm.wake_up()
        RESULT["diff_l1"] = applied()
        llm.sleep(level=2); llm.wake_up()
        RESULT["diff_l2"] = applied()
        RESULT["listed_l2"] = sorted(llm.llm_engine.list_loras())
    """)
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
