"""The probe of ``trl-stale-weights`` reads ``VLLMGeneration``'s source: where that cannot be read (a zipped or
compiled-only install, a class built at run time), the patch stands down with a shape-changed reason, never
fails."""
import inspect
import types

from shim.engine import catalog, probes, registry, versions
from shim.engine.patch import STAND_DOWN


def _upstream():
    module = types.ModuleType("trl.generation.vllm_generation")

    class VLLMGeneration:
        def generate(self):
            pass

        def sync_weights(self):
            pass

    module.VLLMGeneration = VLLMGeneration
    return module


def test_unreadable_source_stands_down_not_failed(monkeypatch):
    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(registry, "_registry", registry._Registry())  # this test's decisions only
    monkeypatch.setattr(versions, "installed", lambda distribution: "1.9.2")
    monkeypatch.setattr(inspect, "getsource", unreadable)
    (patch,) = catalog.load_module("trl_stale_weights")
    module = _upstream()

    registry._on_import(patch, module)

    decision = registry.decisions()[patch.id]
    assert decision.decision == STAND_DOWN, decision.text()
    assert probes.is_changed(decision.reason) and "VLLMGeneration" in decision.reason, decision.text()
    assert not hasattr(module.VLLMGeneration.generate, "__wrapped__")  # nothing applied
