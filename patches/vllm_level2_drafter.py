"""A level-2 sleep discards the speculative-decoding drafter's weights; no trainer push writes them back.

Upstream: vllm-project/vllm#52479 (open): the drafter (EAGLE / MTP / draft model) lives in the ``weights`` pool;
          ``reload_weights`` and a trainer's ``load_weights`` write the target only. 0.33.0 adds the knob
          ``sleep_preserve_parameter_names`` (``draft.*``); 0.34.0 warns once and names that pattern
Affects:  vllm >=0.33.0 (the knob), an engine with ``enable_sleep_mode`` and a speculative config whose trainer
          pushes the policy only (ms-swift 4.6.0 ``vllm_speculative_config``, level 2)
Remove:   when vLLM keeps or restores the drafter at a level-2 sleep itself (vllm#52479)

Outputs stay correct (the target verifies every draft token), but no draft token is accepted: slower rollouts.
Before 0.33 nothing is done: without the knob, keeping the drafter would take host copies of its parameters
around every sleep and wake, a larger change for a loss that costs speed, not correctness.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, params

ID = "vllm-level2-drafter"
_FIELDS = ("enable_sleep_mode", "speculative_config", "sleep_preserve_parameter_names")


def probe(module):
    for name in ("EngineArgs", "AsyncEngineArgs"):
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            return changed(f"no {name}")
        names, reason = params(cls.__init__, f"{name}.__init__")
        if reason:
            return reason
        gone = [f for f in _FIELDS if f not in names]
        if gone:
            return changed(f"{name}.__init__ takes no {'/'.join(gone)}")
    return None


def apply(module, patcher):
    from shim.vllm import drafter

    wrapper = drafter.keep_drafter(ID)
    patcher.wrap(module.EngineArgs, "__init__", wrapper)
    patcher.wrap(module.AsyncEngineArgs, "__init__", wrapper)  # its own dataclass __init__ (one wrap if inherited)


PATCH = Patch(
    id=ID,
    tested_at=("vllm", "0.34.0"),
    issue="vllm-project/vllm#52479",
    distribution="vllm",
    affected=">=0.33.0",
    module="vllm.engine.arg_utils",
    apply=apply,
    probe=probe,
    summary="sleep mode with speculative decoding: sleep_preserve_parameter_names=['draft.*'] unless the caller "
            "set it, so a level-2 sleep keeps the drafter's weights (no push writes them)",
    verified=("CPU: stand-in 0.33.0 and 0.34.0, MTP drafter, `vllm.LLM` and "
              "`AsyncLLM.from_engine_args(AsyncEngineArgs(...))`: level-2 sleep, weights wake, push of the "
              "target's parameters only, kv_cache wake: without the shim the drafter's fingerprint changed "
              "(garbage; same greedy output; 0.34's warning raised), with it kept and no warning (asserted); a "
              "caller's `[]` or `[\"draft.enorm\"]` left alone; no speculative config: nothing set; a trainer that "
              "also pushes its drafter after the weights wake ends with the pushed values; 0.31 stands down. "
              "Mutations: the `AsyncEngineArgs` wrap removed (async cases red), a caller's value overridden or "
              "`[]` taken as unset (left-alone cases red)"),
    changes=("`EngineArgs.__init__` and `AsyncEngineArgs.__init__` (vLLM >=0.33, the dataclasses' own generated "
             "`__init__`: every `LLM(...)` and every `AsyncLLM.from_engine_args` caller builds one): a call that "
             "does not name `sleep_preserve_parameter_names`, with `enable_sleep_mode` and a speculative config "
             "(`speculative_config`, or 0.33's `spec_method`/`spec_model`), gets `[\"draft.*\"]` and one INFO line; "
             "a value the caller passed, `[]` included, stays (so does `from_cli_args`, which passes every field: "
             "`vllm serve` users pass `--sleep-preserve-parameter-names 'draft.*'`). vLLM then keeps the drafter's "
             "own parameters (`Worker._get_sleep_parameters` names them `draft.<name>`, shared embeddings/head "
             "left out; 0.33 host copies restored at the weights wake, 0.34 their allocation offloaded instead of "
             "discarded); `draft.*` matching nothing raises nothing in either. Below 0.33 nothing: no knob "
             "upstream (host copies by the shim would be a larger change for a speed loss). Probe: both classes' "
             "`__init__` take `enable_sleep_mode`, `speculative_config`, `sleep_preserve_parameter_names` The "
             "wrapper is `shim.vllm.drafter`. vLLM accepts `draft.*` matching nothing (no drafter) and acts on it "
             "at level 2 only; a trainer that does push its drafter is unharmed (the kept copy is restored at the "
             "weights wake, and the push writes over it). Below 0.33 the alternative would be host copies made "
             "around the worker's sleep and wake by the shim itself (as `vllm-level2-tensors` does for plain "
             "tensors). verl's level-2 MTP sleep has its own record (`verl-mtp-sleep-level`); TRL passes no "
             "speculative config."),
)

PATCHES = [PATCH]
