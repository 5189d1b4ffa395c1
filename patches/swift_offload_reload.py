"""ms-swift 4.x ``offload_context`` loads models onto the device that it never moved off it (GKD: every 4.x release).

Upstream: modelscope/ms-swift#10109 (PR, merged: reload only the models offload_context moved; fixed GRPOTrainer in
          4.6.0, not GKDTrainer) and #9793 (PR, merged in 4.5.0: skips that context for FSDP2 only)
Affects:  ms-swift >=4.0.0 GKDTrainer.offload_context (4.6.0 included), >=4.0.0,<4.6.0 GRPOTrainer.offload_context,
          with --offload_model true (colocate vLLM), whenever the student / policy is still on the CPU there
Remove:   when ms-swift's GKDTrainer.offload_context reloads only what it moved and the shim's minimum supported
          ms-swift has it

``offload_context`` calls ``load_model`` on exit whatever its ``offload_model`` did: a model still on the CPU
at vLLM's construction (before ``accelerator.prepare``) is loaded WHOLE onto one device right after vLLM took
its share: an out-of-memory at start-up where the model is sized for sharding (FSDP2) or does not fit beside vLLM.
"""
from shim.engine.patch import FIX, Patch
from shim.engine.probes import changed, missing, params, source
from shim.swift import offload_reload

_FIXED = ("models_to_reload", "if self.offload_model(")  # 4.6.0 GRPOTrainer: reloads what offload_model moved


def _probe(module, name: str):
    cls = getattr(module, name, None)
    gone = missing(cls, ("offload_context",), label=name, own=True) or missing(cls, ("offload_model", "load_model"),
                                                                               label=name)
    if gone:
        return gone
    text, unreadable = source(vars(cls)["offload_context"], f"{name}.offload_context")
    if unreadable:
        return unreadable
    if any(marker in text for marker in _FIXED):
        return f"fixed upstream ({name}.offload_context reloads only the models offload_model moved)"
    if "self.offload_model(" not in text or "self.load_model(" not in text:
        return changed(f"{name}.offload_context does not call self.offload_model / self.load_model")
    for method in ("offload_model", "load_model"):
        names, reason = params(getattr(cls, method), f"{name}.{method}")
        if reason:
            return reason
        if names != ["self", "model"]:
            return changed(f"{name}.{method}({', '.join(names)}) is not (self, model)")
    return None


def probe_gkd(module):
    return _probe(module, "GKDTrainer")


def probe_grpo(module):
    return _probe(module, "GRPOTrainer")


def _apply_to(cls_name: str, patch_id: str):
    def apply(module, patcher):
        patcher.wrap(getattr(module, cls_name), "offload_context", offload_reload.wrapper(patch_id))

    return apply


PATCH_GKD = Patch(
    id="swift-gkd-offload-reload",
    kind=FIX,
    tested_at=("swift", "4.6.0"),
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=4.0.0",
    module="swift.rlhf_trainers.gkd_trainer",
    apply=_apply_to("GKDTrainer", "swift-gkd-offload-reload"),
    probe=probe_gkd,
    summary="GKDTrainer.offload_context loads back only the models its offload moved off the device (as 4.6.0's "
            "GRPOTrainer): a student still on the CPU at vLLM's construction is not loaded whole onto one device",
    verified=("CPU: real ms-swift 4.6.0 `GKDTrainer` and 4.5.3 `GKDTrainer` / `GRPOTrainer` (built without "
              "`__init__`, their own `GKDConfig` / `GRPOConfig`), `_prepare_rollout_params` + `_prepare_vllm` on "
              "the stand-in with the trained model on the CPU and CUDA's `Tensor.to` semantics for the stand-in's "
              "GPU (`tests/support/residency.py`): without the shim every byte of the student / policy is on the "
              "device after the construction (asserted, 4.6.0 and 4.5.3); with it none, and a reference model that "
              "was on the device is offloaded and back (per model); around a rollout (model on the device) both "
              "runs offload and reload it. 4.6.0 `GRPOTrainer`: stands down by version and by probe. 4.6.0's "
              "`offload_model` reads `tensor.device.type` (always 'cpu' on a CPU torch), so the rollout-time and "
              "reference-model cases run on 4.5.3 only"),
    changes=("`offload_context` (4.x `GKDTrainer`, every release to 4.6.0; `GRPOTrainer` 4.0.0-4.5.3): on exit "
             "`load_model` runs only for the models that the context's own `offload_model` calls moved (a tensor "
             "of the model somewhere else afterwards: another device or another storage), as 4.6.0's `GRPOTrainer` "
             "does from `offload_model`'s return value. Without it the context around vLLM's construction "
             "(`_prepare_vllm`, before `accelerator.prepare`) loads a model that was still on the CPU whole onto "
             "one device (#10109: DeepSpeed ZeRO-2; #9793: FSDP2 in 4.0-4.4, where 4.5.0 skips the context for "
             "FSDP2 only). A model whose tensors cannot be read counts as moved (upstream's reload); the optimizer "
             "is left to ms-swift. Stands down by probe where `offload_context` reloads on `offload_model`'s "
             "result (4.6.0 `GRPOTrainer`). When the model is still on the CPU there: FSDP2 in 4.0.0-4.4.x "
             "(device_map None; 4.5.0 skips that context for FSDP2), DeepSpeed ZeRO-2 as #10109 reports it "
             "(ms-swift's own loader puts a ZeRO-2 model on cuda:LOCAL_RANK: a CPU load is the user's or a "
             "loader's choice); inferred, not run: every rollout where the model stays on the CPU (FSDP2 with CPU "
             "offload). Upstream, read in the wheels: `offload_context` (a `contextlib` context manager) calls "
             "`self.offload_model(model)` on entry and `self.load_model(model)` on exit for the trained model "
             "(GRPO: and the reference model); `load_model` moves every parameter and CPU buffer to "
             "`get_current_device()` (FSDP2: `model.to(device)`); the first `offload_context` is the one around "
             "vLLM's construction in `RolloutTrainerMixin._prepare_vllm` (`GKDTrainer.__init__` -> "
             "`prepare_rollout`); 4.6.0 (#10109) makes `offload_model` return whether anything moved and has "
             "`GRPOTrainer.offload_context` reload only those models; `GKDTrainer.offload_context` is unchanged in "
             "4.6.0 (the same source in 4.2.0-4.6.0, 4.0.x-4.1.x differ in comments only). While the context "
             "enters, each `offload_model(model)` call is watched (the model counts as moved where one of its "
             "tensors -- parameters, ZeRO-3 partitions, buffers -- is no longer where it was); everything else "
             "(the optimizer, the order, FSDP2's own path) stays ms-swift's."),
)

PATCH_GRPO = Patch(
    id="swift-grpo-offload-reload",
    kind=FIX,
    tested_at=("swift", "4.5.3"),
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=4.0.0,<4.6.0",
    fixed_in="4.6.0",
    module="swift.rlhf_trainers.grpo_trainer",
    apply=_apply_to("GRPOTrainer", "swift-grpo-offload-reload"),
    probe=probe_grpo,
    summary="GRPOTrainer.offload_context loads back only the models its offload moved off the device (as 4.6.0)",
    changes=PATCH_GKD.changes,
    verified=PATCH_GKD.verified,
)

PATCHES = [PATCH_GKD, PATCH_GRPO]
