"""ms-swift's rollout ``set_expandable_segments``, device-agnostic (patch ``swift-expandable-segments`` and its
``-4x`` / ``-megatron`` / ``-ray`` sites; the why is in ``patches/swift_expandable_segments.py``)."""


def set_expandable_segments(enable: bool) -> None:
    """Stand-in for ms-swift's helper (``shim.vllm.sleep.alloc_guard``): ``False`` suspends expandable segments on every
    route and the live setting, ``True`` puts back exactly what the user had."""
    from shim.vllm.sleep import alloc_guard, memory

    if enable:
        alloc_guard.resume()
    else:
        alloc_guard.suspend(memory.probe())
