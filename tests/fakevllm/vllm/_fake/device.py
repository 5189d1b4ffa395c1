"""Hardware stand-in: one process-global fake accelerator (GPU or NPU).

Not an upstream module: it replaces the *hardware and driver* under vLLM -- the
physical memory that ``cuMemCreate``/``cuMemMap`` (vllm/csrc/cumem_allocator.cpp)
or ``aclrtMallocPhysical``/``aclrtMapMem`` (vllm-ascend camem_allocator.cpp) hand
out, and the caching allocator's ``expandable_segments`` setting of
c10/cuda/CUDAAllocatorConfig.h (torch_npu: NPUAllocatorConfig.cpp).

It patches, as hardware stand-ins, ``torch.cuda.mem_get_info``,
``torch.cuda.empty_cache``, ``torch.cuda.synchronize`` and
``torch.cuda.memory._set_allocator_settings`` (and, where torch has them,
``torch._C._accelerator_set/getAllocatorSettings``) (CUDA mode; ``torch.cuda.is_available()``
is left False), or provides the same functions as ``torch.npu`` (NPU mode,
see npu/torch_npu).

Model:
- ``total`` bytes; ``free = total - context - sum(mapped allocations) - cache``.
- An allocation is either in a sleep pool (``pool`` set: a CuMemAllocator /
  CaMemAllocator got the malloc callback and can unmap it) or a plain caching-
  allocator allocation that nothing but ``free()`` releases.
- The bypass (pytorch#147851): in bypass mode (NPU, or FAKEVLLM_TORCH=old), an
  allocation requested inside ``use_memory_pool`` while expandable segments are
  on lands OUTSIDE the pool.
- Torch's per-process cap (``torch.cuda.set_per_process_memory_fraction``, vLLM 0.34's extensible KV
  cache sets it): a caching-allocator allocation fails when torch's reserved bytes (pool segments,
  mapped or not, plain blocks and its cache; not driver-mapped memory such as that KV cache) would pass
  ``fraction x total``, as ``CUDACachingAllocator`` refuses to grow past it.
- The expandable-segments setting is read from the environment at first device
  use (CUDA, as torch parses it: PYTORCH_CUDA_ALLOC_CONF, then -- ROCm only --
  PYTORCH_HIP_ALLOC_CONF, then PYTORCH_ALLOC_CONF; NPU: PYTORCH_NPU_ALLOC_CONF,
  then PYTORCH_ALLOC_CONF) and changed live by ``_set_allocator_settings``.
  On CUDA every parse (the env at first use, each live write) first puts
  ``max_split_size_mb``, ``roundup_power2_divisions`` and
  ``garbage_collection_threshold`` back to their defaults, then applies the
  string: a write that does not name them drops the user's values; every other
  option keeps its value (torch ``c10/core/AllocatorConfig.cpp`` ``parseArgs``,
  also described in vLLM 0.33/0.34 ``device_allocator/alloc_conf.py``). The last
  string parsed is what torch reports as ``allocator_settings`` in a memory
  snapshot (``last_conf``; vLLM 0.33+ reads it as the live config).
"""
from __future__ import annotations

import itertools
import os
import threading
import types
import weakref

import torch

from . import CONTEXT_BYTES, DEVICE_TYPE, ROCM, TOTAL_GB, bypass_mode, log_event


class OutOfMemoryError(RuntimeError):
    pass


def _parse_conf(s: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        k, _, v = part.partition(":")
        out[k.strip()] = v.strip()
    return out


class Allocation:
    """One physical allocation on the fake device.

    ``payload`` (optional) is the object whose contents live in this memory:
    it must provide ``backup() -> obj``, ``restore(obj)`` and ``scramble()``
    (contents become undefined after a discard + re-map)."""

    def __init__(self, ptr: int, nbytes: int, label: str, payload=None):
        self.ptr = ptr
        self.nbytes = int(nbytes)
        self.label = label
        self.payload = payload
        self.mapped = True
        self.torch_owned = True  # False: driver-mapped memory torch does not reserve (0.34's KV cache)
        self.pool = None        # the sleep allocator that tracks it, or None
        self.tag = None
        self.freed = False

    def __repr__(self):
        return (f"Allocation(ptr={self.ptr:#x}, {self.nbytes} B, {self.label!r}, tag={self.tag!r}, "
                f"in_pool={self.pool is not None}, mapped={self.mapped})")


class TensorPayload:
    """The contents of one tracked tensor's allocation (see ``FakeDevice.track``)."""

    def __init__(self, tensor: torch.Tensor):
        self.ref = weakref.ref(tensor)
        self._garbage_seed = 0

    def storage_ptrs(self) -> set:
        t = self.ref()
        return set() if t is None else {t.untyped_storage().data_ptr()}

    def backup(self):
        t = self.ref()
        return None if t is None else t.detach().clone()

    def restore(self, backup) -> None:
        t = self.ref()
        if t is not None and backup is not None:
            with torch.no_grad():
                t.copy_(backup)

    def scramble(self) -> None:
        t = self.ref()
        if t is None or not t.is_floating_point():
            return
        self._garbage_seed += 1
        g = torch.Generator().manual_seed(0xD00D + self._garbage_seed)
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * 2.0)


class FakeDevice:
    def __init__(self, device_type: str, total_bytes: int):
        self.device_type = device_type
        self.total = int(total_bytes)
        self.context = CONTEXT_BYTES
        self.allocations: dict[int, Allocation] = {}
        self.cache_bytes = 0              # freed plain blocks the caching allocator keeps
        self.stranded_bytes = 0           # cached blocks it can no longer reuse (NPU, see map())
        # far above any real address: :meth:`track` keys an allocation by its tensor's storage pointer
        self._ptr = itertools.count(1 << 60, 0x100000)
        self._initialised = False
        self.settings: dict[str, str] = {}
        self.last_conf: str = ""           # torch's last_allocator_settings_ (CUDA)
        self.env_at_init: dict[str, str | None] = {}
        self.active_pool = None           # (allocator, tag) while inside use_memory_pool
        self.fraction = 1.0               # torch.cuda.set_per_process_memory_fraction
        self.lock = threading.RLock()

    # -- allocator configuration ------------------------------------------
    def _env_conf(self) -> tuple[str | None, str | None]:
        if self.device_type == "npu":
            names = ["PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
        else:
            names = ["PYTORCH_CUDA_ALLOC_CONF"] + (["PYTORCH_HIP_ALLOC_CONF"] if ROCM else []) + ["PYTORCH_ALLOC_CONF"]
        for n in names:
            if n in os.environ:
                return n, os.environ[n]
        return None, None

    def ensure_init(self) -> None:
        """First device use: the caching allocator parses its env var once."""
        with self.lock:
            if self._initialised:
                return
            self._initialised = True
            name, val = self._env_conf()
            self.settings = _parse_conf(val or "")
            self.last_conf = val or ""
            self.env_at_init = {"var": name, "value": val}
            log_event("device_init", device=self.device_type, conf_var=name, conf=val,
                      expandable=self.expandable_segments, total=self.total)

    @property
    def expandable_segments(self) -> bool:
        return self.settings.get("expandable_segments", "False") == "True"

    RESET_ON_PARSE = ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold")
    """What torch's CUDA ``parseArgs`` puts back to its default before each parse (see the module doc)."""

    def set_allocator_settings(self, s: str) -> None:
        self.ensure_init()
        if self.device_type == "cuda":
            for key in self.RESET_ON_PARSE:
                self.settings.pop(key, None)
            self.last_conf = s
        self.settings.update(_parse_conf(s))

    def allocator_settings_string(self) -> str:
        self.ensure_init()
        return ",".join(f"{k}:{v}" for k, v in self.settings.items())

    # -- memory --------------------------------------------------------------
    def used(self) -> int:
        return self.context + self.cache_bytes + self.stranded_bytes + sum(a.nbytes for a in self.allocations.values() if a.mapped)

    def torch_reserved(self) -> int:
        """``torch.cuda.memory_reserved()``: torch's segments (a sleep pool's stay reserved while unmapped)."""
        return self.cache_bytes + sum(a.nbytes for a in self.allocations.values() if a.torch_owned)

    def mem_get_info(self) -> tuple[int, int]:
        self.ensure_init()
        with self.lock:
            return max(self.total - self.used(), 0), self.total

    def allocate(self, nbytes: int, label: str = "tensor", payload=None, ptr: int | None = None,
                 torch_owned: bool = True) -> Allocation:
        """Allocate device memory; inside ``use_memory_pool`` it goes to the pool
        unless the bypass applies. ``ptr``: the address (default: a fresh fake one). ``torch_owned``
        False: mapped by the driver outside torch (no pool, no cap)."""
        self.ensure_init()
        with self.lock:
            nbytes = int(nbytes)
            reuse = min(self.cache_bytes, nbytes)
            if self.total - self.used() + reuse < nbytes:
                raise OutOfMemoryError(
                    f"{'NPU' if self.device_type == 'npu' else 'CUDA'} out of memory. Tried to allocate "
                    f"{nbytes / 2**30:.2f} GiB; {(self.total - self.used()) / 2**30:.2f} GiB free")
            limit = self.fraction * self.total
            if torch_owned and self.fraction < 1.0 and self.torch_reserved() - reuse + nbytes > limit:
                raise OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB; "
                    f"{(self.total - self.used()) / 2**30:.2f} GiB free; this process has a memory cap of "
                    f"{limit / 2**30:.2f} GiB (set_per_process_memory_fraction), "
                    f"{self.torch_reserved() / 2**30:.2f} GiB reserved by PyTorch")
            self.cache_bytes -= reuse
            a = Allocation(next(self._ptr) if ptr is None else int(ptr), nbytes, label, payload)
            self.allocations[a.ptr] = a
            a.torch_owned = torch_owned
            if self.active_pool is not None and torch_owned:
                allocator, tag = self.active_pool
                if bypass_mode() and self.expandable_segments:
                    log_event("pool_bypass", label=label, nbytes=nbytes, tag=tag,
                              note="expandable_segments on: allocation landed outside the sleep pool "
                                   "(pytorch#147851)")
                else:
                    a.pool = allocator
                    a.tag = tag
                    allocator._python_malloc_callback((self.index, nbytes, a.ptr, 0))
            return a

    index = 0

    def track(self, tensor: torch.Tensor, label: str = "tensor") -> torch.Tensor:
        """``tensor`` was just allocated on the device (a torch op's output, e.g. a dequantized
        copy): one allocation of its storage's bytes at its storage's address, in the sleep pool
        when made inside ``use_memory_pool``, freed when the tensor is garbage. Its contents
        follow the allocation (offloaded, discarded, undefined after a re-map)."""
        storage = tensor.untyped_storage()
        a = self.allocate(storage.nbytes(), label=label, payload=TensorPayload(tensor), ptr=storage.data_ptr())
        weakref.finalize(tensor, self.free, a)
        return tensor

    def free(self, a: Allocation) -> None:
        with self.lock:
            if a.freed:
                return
            a.freed = True
            self.allocations.pop(a.ptr, None)
            if a.pool is not None:
                a.pool._python_free_callback(a.ptr)
            elif a.mapped and a.torch_owned:
                self.cache_bytes += a.nbytes  # back to the caching allocator

    def unmap(self, a: Allocation) -> None:
        """cuMemUnmap + cuMemRelease: the physical pages go back to the device."""
        with self.lock:
            a.mapped = False

    def map(self, a: Allocation) -> None:
        """cuMemCreate + cuMemMap of fresh physical pages (contents undefined)."""
        with self.lock:
            if self.total - self.used() < a.nbytes:
                # physical pages cannot reuse blocks cached by PyTorch
                raise OutOfMemoryError(
                    f"{'NPU' if self.device_type == 'npu' else 'CUDA'} out of memory while re-mapping "
                    f"{a.nbytes / 2**30:.2f} GiB ({(self.total - self.used()) / 2**30:.2f} GiB free)")
            a.mapped = True
            if a.payload is not None:
                a.payload.scramble()
            if self.device_type == "npu" and self.cache_bytes:
                # vllm-ascend#9563 (issue thread, vllm-ascend 0.18.0): blocks left cached across a
                # sleep are not reused after the wake re-maps the pool ("fragmented"), so each
                # sleep/wake cycle that skips empty_cache leaves them behind; only empty_cache
                # gives them back. Modelled from the report, not from code.
                self.stranded_bytes += self.cache_bytes
                self.cache_bytes = 0

    def empty_cache(self) -> None:
        self.ensure_init()
        with self.lock:
            self.cache_bytes = 0
            self.stranded_bytes = 0

    def synchronize(self, device=None) -> None:
        self.ensure_init()

    def reset(self) -> None:
        """Test helper: forget all allocations and the parsed settings."""
        with self.lock:
            self.allocations.clear()
            self.cache_bytes = 0
            self.stranded_bytes = 0
            self._initialised = False
            self.settings = {}
            self.last_conf = ""
            self.active_pool = None
            self.fraction = 1.0


DEVICE = FakeDevice(DEVICE_TYPE, int(TOTAL_GB * 2**30))


# ---------------------------------------------------------------------------
# torch patching (hardware stand-ins only)
# ---------------------------------------------------------------------------
def _mem_get_info(device=None):
    return DEVICE.mem_get_info()


def _empty_cache():
    DEVICE.empty_cache()


def _synchronize(device=None):
    DEVICE.synchronize(device)


def _set_allocator_settings(s: str):
    DEVICE.set_allocator_settings(s)


def _get_allocator_settings():
    return DEVICE.allocator_settings_string()


def _set_fraction(fraction: float, device=None) -> None:
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    DEVICE.fraction = float(fraction)


def _last_allocator_settings():
    """torch's ``_accelerator_getAllocatorSettings``: the string the allocator config last parsed."""
    DEVICE.ensure_init()
    return DEVICE.last_conf


def _install_cuda() -> None:
    import torch.cuda
    import torch.cuda.memory as cmem
    if getattr(torch.cuda, "_fakevllm_installed", False):
        return
    torch.cuda.mem_get_info = _mem_get_info
    cmem.mem_get_info = _mem_get_info
    torch.cuda.empty_cache = _empty_cache
    cmem.empty_cache = _empty_cache
    torch.cuda.synchronize = _synchronize
    torch.cuda.set_per_process_memory_fraction = cmem.set_per_process_memory_fraction = _set_fraction
    torch.cuda.get_per_process_memory_fraction = cmem.get_per_process_memory_fraction = lambda device=None: DEVICE.fraction
    torch.cuda.memory_reserved = cmem.memory_reserved = lambda device=None: DEVICE.torch_reserved()
    cmem._set_allocator_settings = _set_allocator_settings
    cmem._fakevllm_get_allocator_settings = _get_allocator_settings
    # torch >= 2.9's accelerator-wide pair (what vLLM 0.33+'s ``set_alloc_conf`` and the shim's guard reach
    # first): the fake device's config, not the CPU build's own
    if hasattr(torch._C, "_accelerator_setAllocatorSettings"):
        torch._C._accelerator_setAllocatorSettings = _set_allocator_settings
    if hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        torch._C._accelerator_getAllocatorSettings = _last_allocator_settings
    torch.cuda._fakevllm_installed = True


def make_npu_namespace() -> types.ModuleType:
    """The ``torch.npu`` attribute torch_npu installs (subset)."""
    npu = types.ModuleType("torch_npu.npu")
    mem = types.ModuleType("torch_npu.npu.memory")
    for m in (npu, mem):
        m.mem_get_info = _mem_get_info
        m.empty_cache = _empty_cache
        m._set_allocator_settings = _set_allocator_settings
        m._fakevllm_get_allocator_settings = _get_allocator_settings
        m.memory_allocated = lambda device=None: 0
        m.memory_reserved = lambda device=None: 0
    npu.memory = mem
    npu.synchronize = _synchronize
    npu.is_available = lambda: False  # keep trainers on CPU
    npu.device_count = lambda: 0
    npu.current_device = lambda: 0
    npu.set_device = lambda d: None
    return npu


def install() -> None:
    if DEVICE_TYPE == "cuda":
        _install_cuda()
    else:
        # vllm-ascend / torch_npu live in tests/fakevllm/npu (kept off sys.path in CUDA mode so
        # find_spec("vllm_ascend") is None there, as on a CUDA box).
        import sys
        npu_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "npu")
        if npu_dir not in sys.path:
            sys.path.append(npu_dir)
        import torch_npu  # noqa: F401
