"""A prefix-cache reset after a weight update fails silently and the old KV is reused.

Upstream: vllm-project/vllm#28827 (reset_running_requests, 0.12.0; "the original behavior is pretty
          dangerous because a user might not immediately realize the reset has failed"); TRL and ms-swift
          ignore the result of reset_prefix_cache() after their weight push
Affects:  vllm >=0.12.0 (earlier LLMEngine.reset_prefix_cache drops the result), every trainer
Remove:   when vLLM raises on a failed reset or the trainers check it

``reset_prefix_cache()`` returns False while requests hold KV blocks; nothing retries it, so the next rollout
reuses prefix KV computed with the old weights.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed


def probe(module):
    engine = getattr(module, "LLMEngine", None)
    if engine is None or not callable(getattr(engine, "reset_prefix_cache", None)):
        return changed("LLMEngine.reset_prefix_cache not found")
    return None


def apply(module, patcher):
    from shim.vllm import caches

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
    verified=("CPU: real TRL 1.16.0 / 1.9.2 `VLLMGeneration` push with a request in flight: reset False and stale "
              "prefix reused without the shim (asserted), reset and fresh with it; a stand-in whose reset always "
              "fails: one WARNING over 3 pushes, strict raises"),
    changes=("`LLMEngine.reset_prefix_cache` (what `LLM` and ms-swift call after a push): a False result (KV "
             "blocks held by requests in flight) is retried once the KV cache is idle (at once when nothing is "
             "unfinished, else by preempting the running requests, `reset_running_requests=True`, as vLLM's own "
             "sleep does); still False: one WARNING per engine, `SHIM_STRICT=1` raises The reset is retried by "
             "`shim.vllm.caches`."),
)

PATCHES = [PATCH]
