"""Where a check's engine half runs: in the trainer's process, or on the engine's workers.

In-process executors (``llm_engine.model_executor.driver_worker.model_runner.model``:
TRL/ms-swift colocate, ``external_launcher``) are read directly; any other executor
through ``LLM.apply_model`` (vLLM's ``collective_rpc("apply_model")``: one result per
worker). A multiprocess executor needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to ship the
function; without it the check cannot run there (:class:`Unreachable`). Only digests come
back (a few integers per tensor).
"""
from __future__ import annotations

import functools

from shim.verify import compare
from shim.vllm import engines
from shim.vllm.sleep import sleep_state


class Unreachable(RuntimeError):
    """The engine's workers cannot run the check (another process, no way to ship it)."""


vllm_engine = engines.unwrap


def engine_name(llm) -> str:
    return sleep_state.engine_name(vllm_engine(llm))


def weights_asleep(llm) -> bool:
    tags = engines.reported_asleep(vllm_engine(llm))
    return "weights" in tags if tags is not None else sleep_state.state_for(vllm_engine(llm)).weights_asleep


def in_process_model(llm):
    """The model of an in-process driver worker, or None (multiprocess executors)."""
    engine = vllm_engine(llm)
    worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
    worker = getattr(worker, "worker", None) or worker  # WorkerWrapperBase (older vLLM)
    runner = getattr(worker, "model_runner", None)
    return None if runner is None else runner_model(runner)


def runner_model(runner):
    """A vLLM model runner's model (``get_model()`` unwraps vLLM's CUDA-graph wrapper)."""
    get_model = getattr(runner, "get_model", None)
    return get_model() if callable(get_model) else getattr(runner, "model", None)


def where(llm) -> str:
    """``"in-process"`` or ``"workers"`` (through ``apply_model``)."""
    return "in-process" if in_process_model(llm) is not None else "workers"


def run_on_workers(llm, request: dict) -> list:
    """:func:`shim.verify.compare.fingerprint` on every worker of ``llm``."""
    model = in_process_model(llm)
    if model is not None:
        return [compare.fingerprint(model, request)]
    llm = engines.unproxy(llm)
    apply_model = getattr(llm, "apply_model", None) or getattr(getattr(llm, "llm_engine", None), "apply_model", None)
    if apply_model is None:
        raise Unreachable(f"{type(llm).__name__} has neither an in-process worker nor apply_model")
    try:
        return list(apply_model(functools.partial(_fingerprint_of, request=request)))
    except Exception as exc:  # vLLM refuses to pickle a function without VLLM_ALLOW_INSECURE_SERIALIZATION
        raise Unreachable(f"engine in another process; apply_model failed ({type(exc).__name__}: {exc}); "
                          "VLLM_ALLOW_INSECURE_SERIALIZATION=1 lets it ship the check") from exc


def _fingerprint_of(model, request):
    return compare.fingerprint(model, request)


# ---------------------------------------------------------------------------
# weight version (vLLM >= 0.27.0: LLMEngine.set_weight_version / get_weight_version)
# ---------------------------------------------------------------------------
def set_weight_version(llm, version: str) -> bool:
    """Tag the engine's weights (vLLM stamps its outputs with it); False where vLLM has no tag."""
    setter = getattr(vllm_engine(llm), "set_weight_version", None)
    if not callable(setter):
        return False
    setter(str(version))
    return True


def weight_version(llm) -> "str | None":
    getter = getattr(vllm_engine(llm), "get_weight_version", None)
    if not callable(getter):
        return None
    try:
        return str(getter())
    except Exception:  # an engine core that cannot answer: no tag
        return None
