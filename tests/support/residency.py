"""Hardware stand-in: which host tensors the fake accelerator of tests/fakevllm holds (opt-in, test side).

On a GPU a tensor's bytes are device memory: ``x.to('cpu')`` makes a NEW host tensor,
and the device block goes back to PyTorch's caching allocator when the last reference
to the old storage dies (``torch.cuda.empty_cache()`` then returns it to the driver, so
``mem_get_info`` sees it); ``x.to('cuda:0')`` of a host tensor allocates on the device
(or raises out of memory). On a CPU-only torch every tensor is a host tensor and
``x.to('cpu')`` returns ``x`` itself, so a trainer that moves its tensors off the device
and one that does not look the same. This module makes such moves visible, for the
tensors a test declares device-resident and nothing else:

- :func:`adopt` ``(tensor)``: its storage is on the fake device from now on: a plain
  (caching-allocator) allocation of the storage's bytes on :data:`device.DEVICE`, freed
  -- into the allocator's cache, as on CUDA -- when the storage itself is freed (a
  finalizer on the storage object; torch keeps one Python object per live storage, so it
  fires exactly when the last tensor or view of it is gone).
- :func:`install` replaces ``torch.Tensor.to`` (and so ``Parameter.to``) for the process,
  with CUDA's semantics for resident storages: ``.to('cpu')`` of a resident tensor returns
  a copy (a new host storage); ``.to(<accelerator>)`` (``'cuda'``, ``'cuda:0'``, an int
  index, a ``torch.device``, or ``'npu'`` in NPU mode) returns the tensor itself when it
  is already resident (a dtype change: a resident copy), else a resident copy (the H2D
  copy). The result always stays a CPU tensor of the same values; every other call is
  torch's own. Nothing else (``.cpu()``, ``.cuda()``, ``copy_``, new tensors) changes.

A test puts a trainer on the device the way the real framework does -- e.g. DeepSpeed
ZeRO-3 allocates each rank's partition ``param.ds_tensor`` on the accelerator
(``get_accelerator().current_device_name()``) and leaves ``param.data`` an empty tensor
-- by adopting those tensors after the CPU run placed them on the host.
"""
from __future__ import annotations

import weakref

import torch
from vllm._fake.device import DEVICE

_resident: dict[int, object] = {}  # id(storage) -> Allocation (a live storage keeps one Python object)
_original_to = None


def _storage(t: torch.Tensor):
    return t.untyped_storage()


def is_resident(t: torch.Tensor) -> bool:
    return id(_storage(t)) in _resident


def adopt(t: torch.Tensor, label: str = "tensor") -> torch.Tensor:
    """Declare ``t``'s storage device memory (no-op for an empty or already resident storage)."""
    storage = _storage(t)
    key = id(storage)
    if key in _resident or storage.nbytes() == 0:
        return t
    allocation = DEVICE.allocate(storage.nbytes(), label=label)
    _resident[key] = allocation
    weakref.finalize(storage, _release, key)
    return t


def _release(key: int) -> None:
    allocation = _resident.pop(key, None)
    if allocation is not None:
        DEVICE.free(allocation)


def resident_bytes(tensors) -> int:
    """Bytes of the distinct resident storages among ``tensors``."""
    seen = {}
    for t in tensors:
        storage = _storage(t)
        if id(storage) in _resident:
            seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


def _as_device(value):
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        return torch.device(value)
    if isinstance(value, int) and not isinstance(value, bool):  # torch.cuda.current_device() style index
        return torch.device(DEVICE.device_type, value)
    return None


def _parse(args, kwargs):
    """-> (destination device or None, dtype or None), as Tensor.to reads its arguments."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    if args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            device, dtype = first.device, first.dtype
        elif isinstance(first, torch.dtype):
            dtype = first
        else:
            device = first
            if len(args) > 1 and isinstance(args[1], torch.dtype):
                dtype = args[1]
    return _as_device(device) if device is not None else None, dtype


def _to(self, *args, **kwargs):
    device, dtype = _parse(args, kwargs)
    if device is None or device.type not in ("cpu", DEVICE.device_type):
        return _original_to(self, *args, **kwargs)
    resident = is_resident(self)
    if device.type == "cpu" and not resident:
        return _original_to(self, *args, **kwargs)
    out = self if dtype is None or dtype == self.dtype else _original_to(self, dtype)
    if device.type == "cpu":
        if _storage(out).data_ptr() == _storage(self).data_ptr():
            out = out.clone()  # device -> host: a new host tensor
        return out
    if out is self and resident:
        return self  # already there
    if _storage(out).data_ptr() == _storage(self).data_ptr():
        out = out.clone()  # host -> device: a new device tensor
    return adopt(out, label="to")


def install() -> None:
    global _original_to
    if _original_to is None:
        _original_to = torch.Tensor.to
        torch.Tensor.to = _to
