"""Keep what a level-2 sleep saved, or would lose, until the weights are woken: buffers, plain tensors, globals.

vLLM's ``Worker.sleep(level=2)`` saves ``model.named_buffers()`` (rope ``cos_sin_cache``, ``inv_freq``: values
no checkpoint holds, so neither ``reload_weights`` nor a trainer's push brings them back) and ``Worker.wake_up``
restores them. Up to vLLM 0.26.x (gated on the ``weights`` tag from 0.27.0; the wheels read: 0.10.2-0.26.0
tag-blind, 0.27.0+ gated) and in every vllm-ascend release (``NPUWorker.wake_up``, 0.23.0 and main), the
restore ignores ``tags``: ``wake_up(["kv_cache"])`` after a level-2 sleep copies the buffers into the
still-unmapped weight memory (CUDA_ERROR_ILLEGAL_ADDRESS, vllm#45619; an MTE fault on NPU), and where the copy
does not fault it drops the saved copies, so the later ``wake_up(["weights"])`` leaves them undefined
(:func:`keep_buffers`). What the sleep does not save at all is kept by :func:`save_plain` / :func:`restore_plain`.
"""
from __future__ import annotations

import inspect

from shim.engine import call_args, log
from shim.engine.probes import changed
from shim.vllm import engines
from shim.vllm.weights import tensors


def _tags(wrapped, args, kwargs):
    return call_args.arg(wrapped, args, kwargs, "tags")


def keep_buffers(wrapped, instance, args, kwargs):
    """A wrapper of the worker's ``wake_up``: hides the saved buffers from a wake that does not include
    ``weights`` and puts them back afterwards, so the weights wake restores them -- whatever order the
    trainer wakes the tags in (TRL GOLD 0.25-0.29 wakes ``kv_cache`` first). The wake order itself is left
    alone (``shim.vllm.sleep.wake_plan``)."""
    tags = _tags(wrapped, args, kwargs)
    saved = getattr(instance, "_sleep_saved_buffers", None)
    if tags is None or "weights" in tags or not saved:
        return wrapped(*args, **kwargs)
    instance._sleep_saved_buffers = {}
    log.debug(f"wake_up({list(tags)}) after a level-2 sleep: {len(saved)} saved buffers kept for the weights wake")
    try:
        return wrapped(*args, **kwargs)
    finally:
        if not getattr(instance, "_sleep_saved_buffers", None):
            instance._sleep_saved_buffers = saved


def probe_restore(cls) -> "str | None":
    """None where ``cls.wake_up`` restores the saved buffers without looking at the tags; else why not."""
    wake = vars(cls).get("wake_up")  # the class's own (vLLM's Worker, vllm-ascend's NPUWorker)
    if wake is None:
        return changed(f"{cls.__name__} defines no wake_up")
    try:
        source = inspect.getsource(wake)
    except (OSError, TypeError):
        return changed(f"source of {cls.__name__}.wake_up unavailable")
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("if") and "_sleep_saved_buffers" in text:
            if "weights" in text:
                return "fixed upstream (buffer restore waits for the weights tag)"
            return None
    return changed(f"{cls.__name__}.wake_up restores no _sleep_saved_buffers")


# ---------------------------------------------------------------------------
# plain tensor attributes (neither parameters nor buffers) across a level-2 sleep
# ---------------------------------------------------------------------------
# Up to vLLM 0.33, the level-2 sleep saves ``model.named_buffers()`` only (``Worker.sleep``; 0.33 adds the
# parameters named by ``sleep_preserve_parameter_names`` and the drafter's buffers). 0.34 fixes it
# (``Worker._discardable_parameters``: only allocations holding nothing but parameters are discarded, the
# rest of the weights pool is offloaded like level 1; ``vllm-level2-tensors`` stands down there). A tensor a
# module keeps as a plain attribute -- MLA's ``W_UK_T`` / ``W_UV`` where ``kv_b_proj`` is quantized
# (``process_weights_after_loading``, vLLM 0.16-0.32 on the layer, <= 0.15 on ``layer.impl``), the
# ``q_range`` / ``k_range`` / ``v_range`` constants of ``set_default_quant_scales``, a quant kernel's
# workspace -- was allocated inside the weights pool when the model was built, so the level-2 sleep
# discards it and the wake maps fresh, undefined pages under it. No push rewrites it (the trainer
# pushes parameters; nothing re-runs the post-processing), no buffer restore covers it.
# :func:`save_plain` (a wrapper of the worker's ``sleep``) copies each such storage to the host
# before a level-2 sleep; :func:`restore_plain` (a wrapper of ``wake_up``) writes it back once the
# weights are mapped again (whatever order the tags are woken in).
#
# Left out, because something else rewrites them: tensors sharing storage with a parameter or a
# buffer (unquantized MLA's ``W_UV`` is a view of ``kv_b_proj.weight``: the push rewrites it);
# storage outside the weights pool (not discarded); and, on an engine whose pushes go through
# vLLM's layerwise reload (``shim.vllm.weights.reload``: its finalize re-runs every attention layer's
# ``process_weights_after_loading``), the attributes of the attention layers, which the next push
# derives again.


def _storage_ptr(tensor) -> "int | None":
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, ValueError):
        return None


def _registered_storages(model) -> set:
    ptrs = {_storage_ptr(p) for p in model.parameters()} | {_storage_ptr(b) for b in model.buffers()}
    ptrs.discard(None)
    return ptrs


def _in_weights_pool():
    """``ptr -> bool``: whether a storage lies in a "weights" allocation of the sleep pool."""
    import bisect

    from shim.vllm.sleep import sleep_pool

    spans = sorted(sleep_pool.spans("weights"))
    starts = [s for s, _ in spans]

    def inside(ptr: int) -> bool:
        i = bisect.bisect_right(starts, ptr) - 1
        return i >= 0 and ptr < spans[i][1]

    return inside


def _plain_to_keep(worker) -> list:
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    if model is None:
        return []
    rederived = tensors.pushes_reprocess(model)
    kept = (t for _, _, t, is_attention in tensors.plain_tensors(model) if not (is_attention and rederived))
    return _storages_to_keep(model, kept, set())


def _storages_to_keep(model, tensors, seen: set) -> list:
    """``[(ptr, storage)]`` of ``tensors`` whose storage lies in the weights pool, is no parameter's or buffer's
    of ``model`` and is not in ``seen`` (each storage once; ``seen`` grows)."""
    inside = _in_weights_pool()
    registered = _registered_storages(model)
    keep = []
    for tensor in tensors:
        ptr = _storage_ptr(tensor)
        if ptr is None or ptr in registered or ptr in seen or not inside(ptr):
            continue
        seen.add(ptr)
        keep.append((ptr, tensor.untyped_storage()))
    return keep


def save_plain(wrapped, instance, args, kwargs, _select=None):
    """Wrapper of the worker's ``sleep``: before a level-2 sleep, host copies of the plain tensors it would discard."""
    from shim.engine import call_args

    level = call_args.arg(wrapped, args, kwargs, "level", 1)
    if level == 2:
        import torch

        saved = {}
        for ptr, storage in (_select or _plain_to_keep)(instance):
            host = torch.empty((storage.nbytes(),), dtype=torch.uint8).untyped_storage()
            host.copy_(storage)
            saved[ptr] = (storage, host)
        setattr(instance, engines.SAVED_PLAIN, saved)
    return wrapped(*args, **kwargs)


# ---------------------------------------------------------------------------
# tensors held by module globals (vllm-ascend's rope caches) across a level-2 sleep
# ---------------------------------------------------------------------------
# vllm-ascend (0.13.0 - 0.23.0 at least, ``vllm_ascend/ops/rotary_embedding.py``) keeps rope caches as
# MODULE globals: ``AscendRotaryEmbedding.__init__`` -> ``_record_cos_and_sin_cache_interleaved`` makes
# ``_cos_cache`` / ``_sin_cache`` (two halves of one new tensor) while ``NPUWorker.load_model`` builds the
# model inside the weights pool. No module owns them, so the attribute walk above misses them, the level-2
# sleep discards them and ``NPUWorker.wake_up`` restores buffers only; the MLA / SFA path reads them
# (``get_cos_and_sin_mla``) at every step: silently wrong rope after the wake (fix proposed in
# vllm-ascend#17217). :func:`save_plain_and_globals` (the NPU record's wrapper of ``sleep``) also keeps
# every storage a global of a ``vllm_ascend`` module references, under the same rules: in the weights
# pool, no parameter's or buffer's storage (``_cos_sin_cache`` is the rope's buffer: vllm-ascend restores
# it), each storage once; :func:`restore_plain` writes them back with the rest.

GLOBAL_PACKAGES = ("vllm_ascend",)
"""Packages whose modules' globals :func:`global_tensors` walks (every submodule in ``sys.modules``)."""


def global_tensors(packages=GLOBAL_PACKAGES):
    """``(module name, name, tensor)`` for each tensor a global of an imported module of ``packages`` holds."""
    import sys

    import torch

    for mod_name, module in list(sys.modules.items()):
        if module is None or not any(mod_name == p or mod_name.startswith(p + ".") for p in packages):
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for name, value in items:
            if isinstance(value, torch.Tensor):
                yield mod_name, name, value


def _globals_to_keep(worker, seen: set) -> list:
    """``[(ptr, storage)]`` of the module-global tensors a level-2 sleep would lose (none in ``seen``)."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    if model is None:
        return []
    return _storages_to_keep(model, (t for _, _, t in global_tensors()), seen)


def _plain_and_globals_to_keep(worker) -> list:
    keep = _plain_to_keep(worker)
    return keep + _globals_to_keep(worker, {ptr for ptr, _ in keep})


def save_plain_and_globals(wrapped, instance, args, kwargs):
    """:func:`save_plain`, and the storages of ``vllm_ascend`` module globals in the weights pool."""
    return save_plain(wrapped, instance, args, kwargs, _select=_plain_and_globals_to_keep)


def restore_plain(wrapped, instance, args, kwargs):
    """Wrapper of the worker's ``wake_up``: once the weights are mapped, the saved plain tensors written back."""
    result = wrapped(*args, **kwargs)
    tags = _tags(wrapped, args, kwargs)
    saved = getattr(instance, engines.SAVED_PLAIN, None)
    if saved and (tags is None or "weights" in tags):
        for storage, host in saved.values():
            storage.copy_(host)
        setattr(instance, engines.SAVED_PLAIN, {})
        log.debug(f"wake_up({tags}): {len(saved)} plain tensor storage(s) restored after the level-2 sleep")
    return result


FIXED_034 = "fixed upstream (level 2 discards only the allocations holding nothing but parameters: " \
            "Worker._discardable_parameters, vLLM 0.34)"


def probe_plain(cls) -> "str | None":
    """None where ``cls`` defines ``sleep`` and ``wake_up`` and its ``sleep`` (or the one it calls through
    ``super()``) saves the buffers, and nothing else, at level 2. Fixed upstream where the worker picks the
    parameters a level-2 sleep may discard (vLLM 0.34 ``Worker._discardable_parameters``: everything else in
    the weights pool is offloaded and restored), or where its sleep saves module attributes."""
    missing = [name for name in ("sleep", "wake_up") if name not in vars(cls)]
    if missing:
        return changed(f"{cls.__name__} defines no {'/'.join(missing)}")
    if any(callable(vars(klass).get("_discardable_parameters")) for klass in cls.__mro__):
        return FIXED_034
    for klass in cls.__mro__:
        sleep = vars(klass).get("sleep")
        if sleep is None:
            continue
        try:
            source = inspect.getsource(sleep)
        except (OSError, TypeError):
            return changed(f"source of {klass.__name__}.sleep unavailable")
        if "named_buffers" in source:
            if "vars(" in source or "__dict__" in source:
                return "fixed upstream (the level-2 sleep saves module attributes)"
            return None
        if "super().sleep" not in source:
            break
    return changed(f"{cls.__name__}.sleep saves no named_buffers at level 2")
