"""``verify-weights-verl`` / ``-verl-server`` / ``-vllm-worker`` on the real verl releases.

``children/verl_update.py``: verl's own ``ServerAdapter.update_weights`` (trainer side) -> its ``vLLMHttpServer``
(``collective_rpc``, ``clear_kv_cache``; behind a stand-in of Ray's actor handle, on its own event loop) -> verl's
``BucketedWeightSender`` / ``BucketedWeightReceiver`` (ZMQ and shared memory, as verl does without CUDA IPC) ->
the stand-in's ``AsyncLLM`` worker (engine core in a forked process) loading each bucket with
``model.load_weights``. One trainer step per phase (every weight + 0.01), one update each; ``differs`` is the
truth (the engine tensors that are not the trainer's, read in the worker).

Parametrized over the code shapes: 0.8.0 (``rollout_rank`` gates the server handle; receiver callback
``(weights)``), 0.9.0 (``_has_server``, ``wire_format``, callback ``(weights, is_last)``); 0.7.1 (the 0.8.0
shape with the handle check inline) runs the server-half-missing case.
"""
import json

import pytest

from tests.support.helpers import REPO, clean_env, last_json, run_python
from tests.support.verl_support import verl_environment

CHILD = REPO / "tests" / "patches" / "verify_weights" / "children" / "verl_update.py"
DROP = "model.layers.0.mlp.down_proj.weight"
EXTRA = "model.layers.0.mlp.down_proj.bias"  # Qwen2 has no down_proj bias: vLLM's loader skips it
ON = {"SHIM_VERIFY_WEIGHTS": "1"}


def run(release: str, phases: list, tmp_path, **env) -> tuple:
    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release)
    env = clean_env(**extra, **env, TEST_MODEL=tiny_model(), DROP_FILE=str(tmp_path / "drop"), OMP_NUM_THREADS="1",
                    TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    proc = run_python(CHILD.read_text(), path=path, env=env, argv=[json.dumps(phases)], timeout=300)
    return last_json(proc), proc.stderr


def stale_warnings(phase: dict) -> list:
    return [w for w in phase["warnings"] if "stale weights" in w]


@pytest.mark.parametrize("release", ["0.8.0", "0.9.0", "0.9.1"])
def test_a_tensor_that_does_not_land_is_reported_a_clean_or_partial_update_is_not(release, tmp_path):
    """Shim off: the engine keeps an old ``down_proj`` and nothing says so. On: a clean update is verified and
    silent; the same fault is one WARNING ``stale weights`` naming the tensor; a streamed tensor the engine has no
    parameter for is named too; a partial update (one layer) is verified, the untouched tensors no false alarm;
    the fault in a stream that is an async iterator (a checkpoint engine's ``receive_weights``) is reported, and in
    ``sample`` mode;
    ``SHIM_STRICT=1`` raises ``StaleWeights`` (after verl's update ran)."""
    r, _ = run(release, [
        {"name": "off", "drop": DROP},
        {"name": "clean", "shim": True, "env": ON},
        {"name": "drop", "drop": DROP, "env": ON},
        {"name": "extra", "extra": EXTRA, "env": ON},
        {"name": "partial", "only": "layers.1.", "env": ON},
        {"name": "async", "drop": DROP, "async": True, "env": ON},
        {"name": "sample", "drop": DROP, "env": {"SHIM_VERIFY_WEIGHTS": "sample"}},
        {"name": "strict", "drop": DROP, "env": {**ON, "SHIM_STRICT": "1"}},
    ], tmp_path)
    assert r["off"]["differs"] == [DROP] and r["off"]["warnings"] == [] and r["off"]["raised"] is None, r  # silent
    assert r["clean"]["differs"] == [] and r["clean"]["counts"] == {"verified": 1, "stale": 0, "unverifiable": 0}, r
    assert stale_warnings(r["clean"]) == [], r
    assert r["drop"]["differs"] == [DROP] and r["drop"]["counts"]["stale"] == 1, r
    (warning,) = stale_warnings(r["drop"])
    assert f"first differing: {DROP})" in warning and "ServerAdapter.update_weights" in warning, warning
    (warning,) = stale_warnings(r["extra"])
    assert f"{EXTRA} (streamed, not in the engine)" in warning and r["extra"]["counts"]["stale"] == 1, warning
    assert r["partial"]["differs"] and r["partial"]["counts"] == {"verified": 1, "stale": 0, "unverifiable": 0}, r
    assert stale_warnings(r["partial"]) == [], r
    assert r["async"]["counts"]["stale"] == 1 and len(stale_warnings(r["async"])) == 1, r  # an async iterator too
    (warning,) = stale_warnings(r["sample"])  # sample mode: strided rows of every streamed tensor
    assert "(sample digests; first differing: " + DROP in warning, warning
    assert r["strict"]["raised"] == "StaleWeights" and r["strict"]["counts"]["stale"] == 1, r
    assert r["strict"]["status"] is None, r  # running


def test_without_the_server_half_every_update_is_unverifiable_never_verified(tmp_path):
    """verl 0.7.1 with ``verify-weights-verl-server`` disabled (as when the shim is not active in the Ray actor):
    verl's ``collective_rpc`` drops the workers' answers, the trainer half says so once (``unverifiable``) and
    counts each update; the fault is never called verified."""
    r, err = run("0.7.1", [
        {"name": "off", "drop": DROP},
        {"name": "first", "shim": True, "drop": DROP, "env": ON},
        {"name": "second", "drop": DROP, "env": ON},
    ], tmp_path, SHIM_DISABLED_PATCHES="verify-weights-verl-server")
    assert r["off"]["differs"] == [DROP] and not any(r["off"]["counts"].values()), r
    for name in ("first", "second"):
        assert r[name]["counts"] == {"verified": 0, "stale": 0, "unverifiable": 1}, r
    (warning,) = [w for w in r["first"]["warnings"] if "unverifiable" in w]
    assert "verify-weights-verl-server" in warning and "vLLMHttpServer" in warning, warning
    assert not [w for w in r["second"]["warnings"] if "unverifiable" in w], r  # once per reason
    assert err.count("but unverifiable") == 1, err
    assert "verify-weights-verl-server" in r["second"]["status"], r  # python -m shim status: requested, not running


WRONG_B = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
DROP_MODULE = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("release", ["0.7.1", "0.8.0", "0.9.1"])
def test_lora_adapter_update_verified_and_a_wrong_or_dropped_tensor_reported(release, tmp_path):
    """verl's LoRA adapter updates (``peft_config`` with ``base_sync_done``: verl's worker removes adapter 123 and
    ``add_lora``s a ``TensorLoRARequest`` of the streamed tensors; the engine with vLLM's LoRA). Shim off: one
    ``lora_B`` landing wrong goes unnoticed. On: a clean update is verified (before: every adapter update
    ``unverifiable``); the wrong tensor, and a module dropped from the adapter, are ``stale`` naming them;
    ``SHIM_STRICT=1`` raises. 0.9.x also syncs the base first (``peft_config`` without ``base_sync_done``, names
    resolved to the LoRA layers' ``.base_layer`` ones): verified, a tensor that does not land reported."""
    wrong = f"wrong:{WRONG_B}"
    base = [{"name": "base", "lora_base": True, "shim": True, "env": ON},  # 0.9.0+: resolve_weight_name
            {"name": "base_drop", "lora_base": True, "drop": DROP, "env": ON}] if release >= "0.9" else []
    r, _ = run(release, [
        {"name": "off", "lora": True, "drop": wrong},
        *base,
        {"name": "clean", "lora": True, "shim": True, "env": ON},
        {"name": "wrong", "lora": True, "drop": wrong, "env": ON},
        {"name": "drop", "lora": True, "drop": f"{DROP_MODULE}.", "env": ON},
        {"name": "strict", "lora": True, "drop": wrong, "env": {**ON, "SHIM_STRICT": "1"}},
    ], tmp_path, LORA="1")
    v_proj = "model.layers.1.self_attn.v_proj"
    assert r["off"]["differs"] == [v_proj] and r["off"]["warnings"] == [] and r["off"]["raised"] is None, r
    assert r["clean"]["differs"] == [] and r["clean"]["counts"] == {"verified": 1, "stale": 0, "unverifiable": 0}, r
    assert not [w for w in r["clean"]["warnings"] if "verify-weights" in w], r["clean"]
    assert r["wrong"]["differs"] == [v_proj] and r["wrong"]["counts"]["stale"] == 1, r
    (warning,) = stale_warnings(r["wrong"])
    assert f"first differing: {v_proj}.lora_b (LoRA adapter 123)" in warning and "lora_a" not in warning, warning
    assert r["drop"]["differs"] == [DROP_MODULE] and r["drop"]["counts"]["stale"] == 1, r
    (warning,) = stale_warnings(r["drop"])
    assert f"{DROP_MODULE}.lora_a (LoRA adapter 123: pushed, not in the engine's adapter)" in warning, warning
    assert r["strict"]["raised"] == "StaleWeights" and r["strict"]["counts"]["stale"] == 1, r
    if base:  # the base sync of a LoRA run: the engine's linear layers are vLLM LoRA layers (.base_layer names)
        assert r["base"]["differs"] == [] and r["base"]["counts"]["verified"] == 1, r["base"]
        assert r["base_drop"]["differs"] == [DROP] and r["base_drop"]["counts"]["stale"] == 1, r["base_drop"]
        (warning,) = stale_warnings(r["base_drop"])
        assert "first differing: model.layers.0.mlp.down_proj.base_layer.weight)" in warning, warning
