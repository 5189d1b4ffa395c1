"""A level-2 sleep discards the speculative-decoding drafter's weights; no trainer push writes them back.

Upstream: vllm-project/vllm#52479 (open): the drafter (EAGLE / MTP / draft model) lives in the ``weights`` pool
          and a level-2 sleep discards it with the target; ``reload_weights`` and a trainer's ``load_weights``
          write the target only. 0.33.0 adds ``sleep_preserve_parameter_names`` (``draft.*``: the drafter's own
          parameters, ``Worker._get_sleep_parameters``); 0.34.0 warns once and names that pattern
Affects:  vllm >=0.33.0 (the knob), an engine with ``enable_sleep_mode`` and a speculative config whose trainer
          pushes the policy only (ms-swift 4.6.0 ``vllm_speculative_config``, level 2). Outputs stay correct
          (the target verifies every draft token); no draft token is accepted: slower rollouts
Remove:   when vLLM keeps or restores the drafter at a level-2 sleep itself (vllm#52479)

The patch wraps ``EngineArgs.__init__`` and ``AsyncEngineArgs.__init__`` (``shim.vllm.weights.drafter``): every
``LLM(...)`` builds an ``EngineArgs``, every ``AsyncLLM.from_engine_args`` gets one the caller built. A call
that does not name ``sleep_preserve_parameter_names``, with sleep mode and a speculative config, gets
``["draft.*"]`` (one INFO line); a value the caller gave, ``[]`` included, stays. vLLM accepts ``draft.*``
matching nothing (no drafter), and acts on it at level 2 only. A trainer that does push its drafter is
unharmed: the kept copy is restored at the weights wake, and the push writes over it.

Before 0.33 nothing is done: vLLM has no knob, and keeping the drafter would mean host copies of its
parameters made around the worker's sleep and wake by the shim itself (as ``vllm-level2-tensors`` does for
plain tensors), a larger change for a loss that costs speed, not correctness. verl's level-2 MTP sleep has
its own record (``verl-mtp-sleep-level``); TRL passes no speculative config.
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
    from shim.vllm.weights import drafter

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
    verified="CPU: vLLM stand-in 0.33.0 and 0.34.0, LLM and AsyncLLM with an MTP drafter, level 2, push of the "
             "target only (off: drafter garbage; on: kept; a caller's [] left alone)",
)

PATCHES = [PATCH]
