"""How verl's trainer half of weight verification reaches the rollout workers (through verl's own
``_execute_method``) and counts an update it cannot verify; shared by the full-weight check
(``shim.verl.verify_weights``) and the LoRA adapter check (``shim.verl.verify_adapter``)."""
from __future__ import annotations

import time

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


class Watch:
    """What streams through one of verl's updates, seen as it passes (the full-weight check's digests, the adapter
    check's copies): :meth:`take` per ``(name, tensor)``; a failure stops the watching, never verl's stream."""

    failed = ""
    seconds = 0.0

    def watch(self, weights):
        """``weights`` (verl's generator or async iterator of ``(name, tensor)``), each item seen as it passes."""
        if hasattr(weights, "__aiter__"):
            return self._awatch(weights)
        return self._watch(weights)

    def _watch(self, weights):
        for item in weights:
            self._see(item)
            yield item

    async def _awatch(self, weights):
        async for item in weights:
            self._see(item)
            yield item

    def _see(self, item) -> None:
        if self.failed:
            return
        t0 = time.perf_counter()
        try:
            name, tensor = item
            self.take(name, tensor)
        except Exception as exc:  # never break verl's stream
            self.failed = f"the check failed ({type(exc).__name__}: {exc})"
        self.seconds += time.perf_counter() - t0

    def take(self, name: str, tensor) -> None:
        raise NotImplementedError
