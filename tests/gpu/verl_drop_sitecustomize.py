"""A fault for tests/gpu/verl_grpo.sh phases drop / dropstrict (issue 30 item 1): in every process where vLLM's
Qwen2 model is imported (the vLLM worker of verl's rollout server), ``Qwen2ForCausalLM.load_weights`` silently
skips the tensors whose name contains ``$SHIM_TEST_DROP`` -- a weight push that loses one tensor, which the
shim's verification must report as stale weights at every update. Chained by the shim's bootstrap
sitecustomize (first on PYTHONPATH under ``python -m shim``); never raises."""
import os

_DROP = os.environ.get("SHIM_TEST_DROP", "")


def _install(module):
    cls = getattr(module, "Qwen2ForCausalLM", None)
    if cls is None or getattr(cls.load_weights, "_shim_test_drop", False):
        return
    original = cls.load_weights

    def load_weights(self, weights, *args, **kwargs):
        kept = ((name, w) for name, w in weights if _DROP not in name)
        return original(self, kept, *args, **kwargs)

    load_weights._shim_test_drop = True
    cls.load_weights = load_weights
    print(f"[verl_drop] Qwen2ForCausalLM.load_weights drops *{_DROP}* (pid {os.getpid()})", flush=True)


if _DROP:
    try:
        import wrapt

        wrapt.register_post_import_hook(_install, "vllm.model_executor.models.qwen2")
    except Exception as exc:  # a fault injector: never the reason a process fails to start
        print(f"[verl_drop] not installed: {type(exc).__name__}: {exc}", flush=True)
