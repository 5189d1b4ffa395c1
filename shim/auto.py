"""``import shim.auto`` turns the shim on (before or after trl/swift/vllm imports)."""
import shim as _shim

_shim.activate()
