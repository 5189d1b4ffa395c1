"""How verl's trainer half of weight verification reaches the rollout workers (through verl's own
``_execute_method``) and counts an update it cannot verify; shared by the full-weight check
(``shim.verl.verify_weights``) and the LoRA adapter check (``shim.verl.verify_adapter``)."""
from __future__ import annotations

from shim.engine import config

WORKER_METHOD = "shim_weight_digests"
"""The vLLM worker's method (by name over ``collective_rpc``) that returns :func:`shim.verify.compare.fingerprint`."""
SITE = "verl ServerAdapter.update_weights"


async def ask(adapter, request: dict):
    """The workers' answers through verl's own ``_execute_method`` (the server's ``collective_rpc``)."""
    return await adapter._execute_method(WORKER_METHOD, args=(request,))


def unverifiable(engine, why: str, disable: bool = True) -> None:
    """One update that was asked to be verified and was not: counted; one WARNING per reason; ``disable``: the
    reason holds for every later update of ``engine`` (the check's record of one server, or None: no further asking)."""
    from shim.verify import weights

    weights.record("unverifiable")
    weights.warn_once(f"verl {why}", f"verify-weights ({SITE}): verification requested "
                                     f"({config.SHIM_VERIFY_WEIGHTS}) but unverifiable: {why}; these updates count "
                                     "as shim/rollouts_unverifiable")
    if disable and engine is not None and not engine.disabled:
        engine.disabled = why
        weights.cannot_verify("verl rollout", why)


NO_SERVER_HALF = ("the rollout server returned no digests: the shim's server half (verify-weights-verl-server) "
                  "is not active in the vLLMHttpServer Ray actor (run verl under `python -m shim`, or the "
                  "actor's environment lacks the shim's PYTHONPATH)")
