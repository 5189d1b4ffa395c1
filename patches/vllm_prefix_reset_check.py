"""A prefix-cache reset after a weight update fails silently and the old KV is reused.

Upstream: vllm-project/vllm#28827 (reset_running_requests, 0.12.0; "the original behavior is pretty
          dangerous because a user might not immediately realize the reset has failed"); TRL and ms-swift
          ignore the result of reset_prefix_cache() after their weight push
Affects:  vllm >=0.12.0 (earlier LLMEngine.reset_prefix_cache drops the result), every trainer
Remove:   when vLLM raises on a failed reset or the trainers check it

``reset_prefix_cache()`` returns False while requests hold KV blocks. The patch
wraps ``LLMEngine.reset_prefix_cache`` (``vllm.LLM`` delegates to it; ms-swift
calls it directly): a False result is retried once the KV cache is idle (at once
when no request is unfinished, else with the running requests preempted), and a
second False is one WARNING per engine (``SHIM_STRICT=1`` raises)
(``shim.vllm.weights.caches``).
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed


def probe(module):
    engine = getattr(module, "LLMEngine", None)
    if engine is None or not callable(getattr(engine, "reset_prefix_cache", None)):
        return changed("LLMEngine.reset_prefix_cache not found")
    return None


def apply(module, patcher):
    from shim.vllm.weights import caches

    patcher.wrap(module.LLMEngine, "reset_prefix_cache", caches.check_prefix_reset)


PATCH = Patch(
    id="vllm-prefix-reset-check",
    tested_at=("vllm", "0.24.0"),
    issue="vllm-project/vllm#28827",
    distribution="vllm",
    affected=">=0.12.0",
    module="vllm.v1.engine.llm_engine",
    apply=apply,
    probe=probe,
    summary="reset_prefix_cache() == False retried once the KV cache is idle; still False: one WARNING "
            "(SHIM_STRICT raises)",
    verified="CPU: vLLM stand-in (requests in flight at the push), real TRL 1.16.0 VLLMGeneration",
)

PATCHES = [PATCH]
