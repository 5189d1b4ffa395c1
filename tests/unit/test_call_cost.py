"""The cheap paths of the per-call bookkeeping (issue 12, part 6): the same answers as the slow ones.

- ``shim.engine.call_args.arg`` reads a positional-only call from the cached signature's positions
  instead of ``inspect``'s ``bind_partial``;
- ``shim.vllm.sleep.sleep_pool.bytes_by_tag`` / ``tracked_bytes`` keep the pool's sums while its records
  keep their count and newest key, and sum again when either changes or when ``exact``.

The pool here is a stand-in for vLLM's ``CuMemAllocator`` singleton
(``vllm/device_allocator/cumem.py``): ``instance.pointer_to_data`` maps a pointer to an
``AllocationData`` whose ``handle[1]`` is its size and ``tag`` its tag; ``get_current_usage()``
sums the sizes. A sleep keeps the records (it unmaps and releases each handle).
"""
from __future__ import annotations

import inspect
import sys
import types

import pytest

from shim.engine import call_args
from shim.vllm.sleep import sleep_pool
from shim.vllm.sleep.memory import Probe

GiB = 1 << 30


# ---------------------------------------------------------------------------------------------
# call_args.arg
# ---------------------------------------------------------------------------------------------
class Engine:
    def wake_up(self, tags=None):
        pass

    def sleep(self, level: int = 1, mode="abort"):
        pass

    def star(self, *args, tags=None):
        pass

    def kw(self, level=1, **kwargs):
        pass


def _slow(wrapped, args, kwargs, name, default=None):
    """What ``arg`` answered before its fast path: ``inspect`` binding."""
    try:
        bound = inspect.signature(wrapped).bind_partial(*args, **kwargs)
    except TypeError:
        return default
    if name in bound.arguments:
        return bound.arguments[name]
    for value in bound.arguments.values():
        if isinstance(value, dict) and name in value:
            return value[name]
    return default


CALLS = [
    ("wake_up", (["weights"],), {}, "tags"),
    ("wake_up", (), {}, "tags"),
    ("wake_up", (), {"tags": ["kv_cache"]}, "tags"),
    ("wake_up", (["a"], ["b"]), {}, "tags"),  # does not bind: the default
    ("sleep", (2,), {}, "level"),
    ("sleep", (2, "wait"), {}, "mode"),
    ("sleep", (), {}, "level"),
    ("sleep", (), {"level": 2}, "level"),
    ("star", (1, 2), {}, "tags"),  # *args: through inspect
    ("star", (1,), {"tags": ["x"]}, "tags"),
    ("kw", (), {"tags": ["y"]}, "tags"),  # the callee's **kwargs
    ("kw", (2,), {"other": 1}, "level"),
]


@pytest.mark.parametrize("method, args, kwargs, name", CALLS)
def test_arg_answers_as_inspect_binding(method, args, kwargs, name):
    wrapped = getattr(Engine(), method)
    assert call_args.arg(wrapped, args, kwargs, name, "default") == _slow(wrapped, args, kwargs, name, "default")


@pytest.mark.parametrize("method, args, kwargs, name", CALLS)
def test_arg_of_a_method_called_through_its_class_answers_as_bound(method, args, kwargs, name):
    """``Cls.method(obj, ...)`` (how a Ray actor calls each method): wrapt hands the wrapper
    ``PartialCallableObjectProxy(function, obj)``, the arguments without ``obj``. Answered as for the bound method,
    also after the class's function was read (a probe: its signature has ``self``), under wrapt 1.x too (whose
    signature of the proxy keeps ``self``)."""
    import wrapt

    call_args.signature(getattr(Engine, method))
    wrapped = wrapt.PartialCallableObjectProxy(getattr(Engine, method), Engine())
    bound = getattr(Engine(), method)
    assert call_args.arg(wrapped, args, kwargs, name, "default") == _slow(bound, args, kwargs, name, "default")


def test_arg_positional_call_does_not_bind(monkeypatch):
    """The fast path is taken (no ``bind_partial``) for a positional-only call of a plain signature."""
    wrapped = Engine().wake_up
    call_args.arg(wrapped, (["weights"],), {}, "tags")  # signature cached

    def refuse(*a, **k):
        raise AssertionError("bound through inspect")

    monkeypatch.setattr(inspect.Signature, "bind_partial", refuse)
    assert call_args.arg(wrapped, (["weights"],), {}, "tags") == ["weights"]
    assert call_args.arg(Engine().sleep, (2,), {}, "level") == 2


# ---------------------------------------------------------------------------------------------
# sleep_pool sums
# ---------------------------------------------------------------------------------------------
class AllocationData:
    def __init__(self, size, tag):
        self.handle = (0, size, 0, 0)
        self.tag = tag


class CuMemAllocator:
    instance = None

    def __init__(self):
        self.pointer_to_data = {}

    def get_current_usage(self):
        return sum(d.handle[1] for d in self.pointer_to_data.values())


@pytest.fixture
def pool(monkeypatch):
    module = types.ModuleType("vllm.device_allocator.cumem")
    module.CuMemAllocator = CuMemAllocator
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", module)
    alloc = CuMemAllocator()
    monkeypatch.setattr(CuMemAllocator, "instance", alloc)
    monkeypatch.setattr(sleep_pool, "_cache", [None, None, {}])
    alloc.pointer_to_data.update({1: AllocationData(2 * GiB, "weights"), 2: AllocationData(8 * GiB, "kv_cache")})
    return alloc


PROBE = Probe("cuda", None)


def test_pool_sums_follow_the_records(pool):
    assert sleep_pool.bytes_by_tag(PROBE) == {"weights": 2 * GiB, "kv_cache": 8 * GiB}
    assert sleep_pool.tracked_bytes(PROBE) == pool.get_current_usage() == 10 * GiB
    pool.pointer_to_data[3] = AllocationData(1 * GiB, "kv_cache")  # a new allocation: a new newest key
    assert sleep_pool.bytes_by_tag(PROBE) == {"weights": 2 * GiB, "kv_cache": 9 * GiB}
    del pool.pointer_to_data[1]  # a freed one: the count changes
    assert sleep_pool.tracked_bytes(PROBE) == pool.get_current_usage() == 9 * GiB


def test_pool_sums_are_kept_while_the_records_are_and_exact_sums_again(pool):
    assert sleep_pool.tracked_bytes(PROBE) == 10 * GiB
    pool.pointer_to_data[1].handle = (0, 3 * GiB, 0, 0)  # unseen by the signature (count, newest key)
    assert sleep_pool.tracked_bytes(PROBE) == 10 * GiB  # the kept sum
    assert sleep_pool.tracked_bytes(PROBE, exact=True) == pool.get_current_usage() == 11 * GiB
    assert sleep_pool.bytes_by_tag(PROBE) == {"weights": 3 * GiB, "kv_cache": 8 * GiB}


def test_pool_sums_of_another_allocator_are_not_reused(pool, monkeypatch):
    assert sleep_pool.tracked_bytes(PROBE) == 10 * GiB
    other = CuMemAllocator()
    other.pointer_to_data.update({1: AllocationData(1 * GiB, "weights"), 2: AllocationData(1 * GiB, "kv_cache")})
    monkeypatch.setattr(CuMemAllocator, "instance", other)  # same count, same newest key
    assert sleep_pool.tracked_bytes(PROBE) == 2 * GiB


def test_caller_cannot_change_the_kept_sums(pool):
    sleep_pool.bytes_by_tag(PROBE)["weights"] = 0
    assert sleep_pool.bytes_by_tag(PROBE)["weights"] == 2 * GiB
