"""Weight verification before each colocated generate (SHIM_VERIFY_WEIGHTS; no upstream bug of its own).

Upstream: none (users ask for it: vllm RFC #52689, verl#6666, a stale-weights detector in a
          huggingface/trl#5312 comment); catches #5312, the level-2 gaps and any other missing push
Affects:  only with SHIM_VERIFY_WEIGHTS=1|exact|sample: vllm >=0.8.0; trl >=0.28.0, >=0.25.0,<0.28.0 (GRPO/RLOO),
          >=0.25.0,<1.0.0 (GOLD); ms-swift >=3.10.0,<4.0.0 and >=4.0.0 colocate; verl >=0.7.1
Remove:   never (a run-time check, not a fix); a row goes when its trainer leaves the supported range

Verify-only records, independent of the fixes (they apply whether or not a bug patch does), so a missing push
shows whatever its cause. Two halves (``shim.verify.weights``): a trainer record arms the engine with the trainer
model for the duration of its generate method, ``verify-weights-vllm`` compares the two right before vLLM
samples; ms-swift and verl have their own sites (their records say where).
"""
from shim.engine.patch import FEATURE, Patch
from shim.engine.probes import changed, missing
from shim.trl import colocate

SITES = ("VLLMGeneration.generate (trl >=0.28), GRPO/RLOO _generate_single_turn (0.25-0.27), "
         "OnlineDPO _generate_vllm_colocate, GOLD _generate_on_policy_outputs_vllm (<1.0), "
         "ms-swift RolloutTrainerMixin._infer_single_or_multi_turn")


def _off():
    from shim.engine import config

    if config.verify_weights():
        return None
    bad = config.problem(config.SHIM_VERIFY_WEIGHTS)
    return f"{config.SHIM_VERIFY_WEIGHTS} is off" + (f" (bad value {bad.value!r})" if bad else "")


# -- vLLM: the check, right before sampling -------------------------------------------------
def _probe_vllm(module):
    return missing(getattr(module, "LLM", None), ("generate", "chat"), "LLM") or _off()


def _apply_vllm(module, patcher):
    from shim.verify.generate import generate_wrapper

    patcher.wrap(module.LLM, "generate", generate_wrapper)
    patcher.wrap(module.LLM, "chat", generate_wrapper)


# -- TRL: which trainer model the engine must equal ----------------------------------------
def _arming(class_name, method, predicate, llm_attr="llm"):
    def probe(module):
        return missing(getattr(module, class_name, None), (method,), class_name) or _off()

    def apply(module, patcher):
        from shim.trl.verify_weights import arming_wrapper

        patcher.wrap(getattr(module, class_name), method, arming_wrapper(f"{class_name}.{method}", predicate, llm_attr))

    return probe, apply


# -- ms-swift: no LLM.generate; verify before the rollout's inference -------------------------
def _probe_swift(module):
    mixin = getattr(module, "RolloutTrainerMixin", None)
    return missing(mixin, ("_infer_single_or_multi_turn", "_fast_infer"), "RolloutTrainerMixin") or _off()


def _apply_swift(module, patcher):
    from shim.swift.verify_weights import infer_wrapper

    patcher.wrap(module.RolloutTrainerMixin, "_infer_single_or_multi_turn", infer_wrapper)


# -- verl: the trainer half, the rollout server's and the vLLM worker's parts ---------------------------
def _coroutine(module, class_name, name):
    import inspect

    func = vars(getattr(module, class_name)).get(name)  # verl's update_weights is under @torch.no_grad()
    ok = func is not None and inspect.iscoroutinefunction(inspect.unwrap(func))
    return None if ok else changed(f"{class_name}.{name} is no coroutine")


def _probe_verl(module):
    from shim.engine import call_args

    reason = missing(getattr(module, "ServerAdapter", None), ("update_weights", "_execute_method"), "ServerAdapter")
    if reason:
        return reason
    names = call_args.positional_names(module.ServerAdapter.update_weights) or ()
    if names[1:2] != ("weights",):
        return changed("ServerAdapter.update_weights(self, weights, ...) not found")
    return _coroutine(module, "ServerAdapter", "update_weights") or _off()


def _apply_verl(module, patcher):
    from shim.verl import verify_weights

    patcher.wrap(module.ServerAdapter, "update_weights", verify_weights.update_weights_wrapper)


def _probe_verl_server(module):
    from shim.engine import probes

    reason = (missing(getattr(module, "vLLMHttpServer", None), ("collective_rpc",), "vLLMHttpServer")
              or _coroutine(module, "vLLMHttpServer", "collective_rpc"))
    if reason:
        return reason
    source, reason = probes.source(module.vLLMHttpServer.collective_rpc, "vLLMHttpServer.collective_rpc")
    if source is None:
        return reason
    if "return await self.engine.collective_rpc(" in source:
        return "fixed upstream (collective_rpc returns the workers' results)"
    if "await self.engine.collective_rpc(" not in source:
        return changed("vLLMHttpServer.collective_rpc does not await engine.collective_rpc")
    return _off()


def _apply_verl_server(module, patcher):
    from shim.verl import verify_weights

    patcher.wrap(module.vLLMHttpServer, "collective_rpc", verify_weights.collective_rpc_wrapper)


def _probe_worker(module):
    from shim.verl.verify_weights import WORKER_METHOD

    if not isinstance(getattr(module, "Worker", None), type):
        return changed("Worker not in vllm.v1.worker.gpu_worker")
    if WORKER_METHOD in vars(module.Worker):
        return changed(f"Worker.{WORKER_METHOD} exists already")
    return _off()


def _apply_worker(module, patcher):
    from shim.verl import verify_weights

    patcher.set(module.Worker, verify_weights.WORKER_METHOD, verify_weights.WorkerMethod())


VERL_VERIFIED = ("CPU: real verl 0.7.1, 0.8.0, 0.9.0 and 0.9.1 ServerAdapter.update_weights -> vLLMHttpServer "
                 "(collective_rpc, clear_kv_cache) -> verl's BucketedWeightSender/Receiver (ZMQ, shared memory) -> the vLLM stand-in's "
                 "AsyncLLM worker (engine core in a forked process): a tensor the engine leaves out goes unreported "
                 "without the shim, is reported (stale weights, StaleWeights with SHIM_STRICT=1) with it, also from "
                 "an async iterator; a streamed tensor the engine lacks is named; a clean and a partial update stay "
                 "silent; 0.7.1 with the server half disabled: every update unverifiable, one WARNING, status reason. "
                 "verl 0.9.1 with vLLMHttpServer a real Ray actor (local Ray 2.49 cluster, under python -m shim, wrapt "
                 "2.x and 1.x): every update verified, a tensor the worker leaves out reported, StaleWeights with "
                 "SHIM_STRICT=1 (before the fix: unverifiable, 'returned no digests', as on the H200). LoRA adapter "
                 "updates (verl 0.7.1/0.8.0/0.9.1, the engine with vLLM's LoRA, verl's TensorLoRARequest/add_lora): "
                 "a clean one verified (before: unverifiable), a lora_B landing wrong or a module dropped reported "
                 "naming it, StaleWeights with SHIM_STRICT=1")


CHANGES = ("nothing changes in what runs: the trainer's generate method names the trainer model its engine must "
           "equal; `vllm.LLM.generate`/`chat` (innermost, after any push) compares the two (ms-swift: before "
           "`_infer_single_or_multi_turn`). Applies whether or not a fix applies (TRL 1.10.0+, a patch disabled or "
           "standing down); stands down when the switch is off. Trainer sites: `VLLMGeneration.generate` (0.28+: "
           "GRPO, RLOO, GOLD and distillation from 1.0), `GRPOTrainer`/`RLOOTrainer._generate_single_turn` "
           "(0.25-0.27), `OnlineDPOTrainer._generate_vllm_colocate`, "
           "`GOLDTrainer._generate_on_policy_outputs_vllm` (0.25-0.29); `vllm.LLM.generate`/`chat` verifies, "
           "inside every other wrapper (the shim's push-before-generate runs first), an engine a trainer armed. "
           "ms-swift drives vLLM's `LLMEngine` without `LLM.generate`: its record verifies directly before "
           "`RolloutTrainerMixin._infer_single_or_multi_turn` (called by `_fast_infer` after its wake and push; "
           "3.10.x `swift.trainers.rlhf_trainer`, 4.x `swift.rlhf_trainers`), colocate fast inference only, never "
           "with `async_generate` (rollouts one step behind by design).")
"""What the shim changes at the TRL, ms-swift and vLLM sites (verl's: their summaries)."""

VERIFIED = ("CPU: real TRL 1.9.2 `GRPOTrainer` with `trl-stale-weights` disabled: `stale weights` reported at "
            "exactly the rollouts the test's bit-for-bit observation finds stale (4 of 6), silent with the fix (6 "
            "of 6 verified), `SHIM_STRICT=1` stops the run; TRL 1.10.0 verified; real "
            "TRL 1.10.0 with every push missing one tensor (left discarded by the level-2 sleep): exact (the default) reports every rollout, sample within ceil(mapped/8) checks; an LLM "
            "without chat (this record's vLLM half stands down): every rollout counted unverifiable, one WARNING, "
            "status reason; digests equal to the definition, every single changed element and swaps seen, chunking "
            "and routes agree; tensor-parallel slices on CPU tensors (rank r of 2, fused `qkv_proj`/`gate_up_proj`, "
            "row/vocab parallel, replicated kv heads). "
            "PEFT LoRA (bf16): real TRL 1.16.0/1.9.2 GRPO, 0.27.2 GRPO and RLOO, ms-swift 4.6.0/3.10.1 full push with "
            "the adapter merged: every rollout verified against the adapter merged as the push merges it (before: "
            "every one unverifiable); a push leaving out one LoRA-merged tensor reported naming it; ms-swift with "
            "vLLM's own LoRA (4.6.0, 3.10.1, 3.11.1): the adapter in vLLM's LoRA manager and its device slots "
            "compared too, every clean rollout verified (before: unverifiable), a dropped module, a stale lora_B, "
            "a zeroed slot and the level-2 LoRA gaps reported at exactly the generates they affect")


def _patch(patch_id, distribution, affected, module, probe_apply, summary, tested_at, verified=VERIFIED):
    probe, apply = probe_apply
    return Patch(id=patch_id, kind=FEATURE, tested_at=tested_at, switch="SHIM_VERIFY_WEIGHTS",
                 issue="weight verification (SHIM_VERIFY_WEIGHTS)",
                 distribution=distribution,
                 affected=affected, module=module, apply=apply, probe=probe, summary=summary,
                 verified=verified, changes=CHANGES if verified is VERIFIED else "")


PATCHES = [
    _patch("verify-weights-vllm", "vllm", ">=0.8.0", "vllm.entrypoints.llm", (_probe_vllm, _apply_vllm),
           "LLM.generate/chat: an armed engine's weights compared with the trainer's right before sampling", ("vllm", "0.24.0")),
    _patch("verify-weights-trl", "trl", ">=0.28.0", "trl.generation.vllm_generation",
           _arming("VLLMGeneration", "generate", colocate.generation_colocate),
           "VLLMGeneration.generate (colocate) arms its engine with the trainer model", ("trl", "1.9.2")),
    _patch("verify-weights-trl-grpo", "trl", ">=0.25.0,<0.28.0", "trl.trainer.grpo_trainer",
           _arming("GRPOTrainer", "_generate_single_turn", colocate.trainer_colocate),
           "GRPOTrainer._generate_single_turn (colocate) arms its engine with the trainer model", ("trl", "0.27.2")),
    _patch("verify-weights-trl-rloo", "trl", ">=0.25.0,<0.28.0", "trl.trainer.rloo_trainer",
           _arming("RLOOTrainer", "_generate_single_turn", colocate.trainer_colocate),
           "RLOOTrainer._generate_single_turn (colocate) arms its engine with the trainer model", ("trl", "0.27.2")),
    _patch("verify-weights-trl-online-dpo", "trl", ">=0.28.0", "trl.experimental.online_dpo.online_dpo_trainer",
           _arming("OnlineDPOTrainer", "_generate_vllm_colocate", colocate.trainer_colocate),
           "OnlineDPOTrainer._generate_vllm_colocate arms its engine with the trainer model", ("trl", "1.9.2")),
    _patch("verify-weights-trl-gold", "trl", ">=0.25.0,<1.0.0", "trl.experimental.gold.gold_trainer",
           _arming("GOLDTrainer", "_generate_on_policy_outputs_vllm", colocate.gold_colocate, llm_attr="vllm_engine"),
           "GOLDTrainer._generate_on_policy_outputs_vllm (colocate) arms its engine with the trainer model", ("trl", "0.29.1")),
    _patch("verify-weights-swift", "ms-swift", ">=3.10.0,<4.0.0", "swift.trainers.rlhf_trainer.rollout_mixin",
           (_probe_swift, _apply_swift),
           "RolloutTrainerMixin: the engine's weights compared with the trainer's before each colocate rollout", ("swift", "3.10.1")),
    _patch("verify-weights-swift-4x", "ms-swift", ">=4.0.0", "swift.rlhf_trainers.rollout_mixin",
           (_probe_swift, _apply_swift),
           "RolloutTrainerMixin: the engine's weights compared with the trainer's before each colocate rollout", ("swift", "4.6.0")),
    _patch("verify-weights-verl", "verl", ">=0.7.1", "verl.workers.rollout.vllm_rollout.vllm_rollout",
           (_probe_verl, _apply_verl),
           "ServerAdapter.update_weights: the tensors verl streams are digested as they pass, then compared with "
           "the engine's after the update (tested 0.7.1-0.9.1)", ("verl", "0.8.0"), VERL_VERIFIED),
    _patch("verify-weights-verl-server", "verl", ">=0.7.1", "verl.workers.rollout.vllm_rollout.vllm_async_server",
           (_probe_verl_server, _apply_verl_server),
           "vLLMHttpServer.collective_rpc (Ray actor) returns the workers' digests for the shim's own method "
           "(verl's returns nothing; tested 0.7.1-0.9.1, 0.9.1 on real Ray)", ("verl", "0.8.0"), VERL_VERIFIED),
    _patch("verify-weights-vllm-worker", "vllm", ">=0.8.0", "vllm.v1.worker.gpu_worker", (_probe_worker, _apply_worker),
           "vLLM Worker.shim_weight_digests: digests of the worker's weights, by name over collective_rpc "
           "(verl's engine half)", ("vllm", "0.24.0"), VERL_VERIFIED),
]
