"""A trainer's weight push through vLLM's own reload path, so what vLLM derives from the weights follows them.

vLLM finishes a model load with ``process_weights_after_loading``: quantized layers quantize or
repack their weights, MoE layers put the experts in their kernel's layout (FlashInfer CUTLASS swaps
``w13`` to ``w31``, TRT-LLM blocks it: vllm#42821), and MLA attention (DeepSeek-V2/V3,
``model_executor/layers/attention/mla_attention.py``) derives ``W_UK_T`` / ``W_UV`` from
``kv_b_proj`` -- its own copies where ``kv_b_proj`` is quantized (a view of the weight where it is
not). A raw ``model.load_weights([(name, tensor)])`` -- the colocated push of TRL (``VLLMGeneration.
sync_weights``, ``OnlineDPOTrainer._move_model_to_vllm``, the 0.x trainers' ``_move_model_to_vllm``)
-- writes the checkpoint-format tensor and runs none of it: decode keeps multiplying by the initial
checkpoint's matrices (after a level-2 sleep, by whatever the re-mapped pages hold).

vLLM's own path for new weights in checkpoint format is ``GPUModelRunner.reload_weights(
weights_iterator=..., is_checkpoint_format=True)`` (vLLM 0.16.0+, read in the 0.16.0, 0.20.0, 0.24.0 and
0.33.0 wheels; 0.15.1 has only a disk ``reload_weights()``): ``initialize_layerwise_reload(model)``,
``model.load_weights(...)``, ``finalize_layerwise_reload(model, model_config)``. It must run ONCE
per push: a reload per tensor (or per chunk) finalizes every layer the chunk did not complete
(SkyRL#1680 / #1737). The trainer's push calls ``model.load_weights`` once per tensor, inside its own
gather / merge contexts, so its tensors cannot be handed over as one iterator; :func:`session` opens
the reload around the whole push instead -- what vLLM's ``Worker.start_weight_update`` /
``update_weights`` / ``finish_weight_update`` do for chunked updates (0.24). The encoder and
multi-modal cache reset that 0.24's ``reload_weights`` adds after the finalize is left to
``trl-vlm-encoder-cache`` (``shim.vllm.weights.caches``), which already follows these pushes and has its own
switch.

The finalize assigns what ``process_weights_after_loading`` derives as NEW tensors (``self.W_UV =
...``), made outside the sleep pool (the reload runs outside ``use_memory_pool``), at addresses no
captured CUDA graph knows: vLLM keeps the storage of parameters and buffers
(``_copy_and_restore_kernel_tensors``), not that of plain attributes. :func:`session` copies each
re-derived plain attribute into the storage it had before the push -- inside the weights pool,
where the CUDA graphs point -- and puts that tensor back (0.33 does the same for MLA with
``replace_parameter``). One that changed shape or dtype stays new (one DEBUG line).

Before 0.16 (no layerwise reload), or where vLLM's ``initialize_layerwise_reload`` fails: the push runs
as it is, then every attention layer whose own parameters or ``kv_b_proj`` it wrote re-runs its
``process_weights_after_loading``, called with the signature the installed class has (:func:`_reprocess`:
``(act_dtype)`` up to 0.33, no argument from 0.34). MLA re-derives, a plain ``Attention`` its KV-cache scales
(its quant method first, as vLLM's reload); the quantized / repacked linear and
MoE layers cannot be redone without the layerwise reload. The same copy-back follows.
"""
from __future__ import annotations

import contextlib

from shim.engine import log
from shim.vllm.weights import tensors

IN_SESSION = "_shim_push_session"
"""Model attribute: a session is open on this model (a nested push joins it)."""


def runner_of(llm):
    """The model runner of a colocated engine (what TRL reaches through
    ``llm.llm_engine.model_executor.driver_worker.model_runner``), or None."""
    from shim.vllm import engines

    engine = engines.unwrap(llm)
    worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
    return getattr(worker, "model_runner", None)


NEEDS = "_shim_needs_reprocess"
"""Model attribute: :func:`needs_reprocess`'s answer, computed once per model."""
DERIVING = ("MLAAttention",)
"""vLLM layer classes whose ``process_weights_after_loading`` derives tensors from unquantized weights
(MoE layers are told by their quant method: ``UnquantizedFusedMoEMethod`` re-lays the experts too)."""


def needs_reprocess(model) -> bool:
    """Whether vLLM derives anything from ``model``'s weights after a load that a raw push leaves stale:
    MLA attention, fused MoE experts, or a quantized layer (a quant method other than vLLM's
    ``Unquantized*``). A dense unquantized model derives nothing: its pushes run exactly as without the
    shim, outside any reload session."""
    cached = vars(model).get(NEEDS)
    if cached is None:
        cached = False
        for module in model.modules():
            method = getattr(module, "quant_method", None)
            kind = type(method).__name__ if method is not None else ""
            if type(module).__name__ in DERIVING or (kind and ("MoE" in kind or not kind.startswith("Unquantized"))):
                cached = True
                break
        setattr(model, NEEDS, cached)
    return cached


def _layerwise():
    """``(open(model), close(model, runner))`` of vLLM's reload, or None where this vLLM has none: 0.34's
    ``start_reload`` / ``finish_reload`` where they exist (they set ``weight_update_active()``, which some
    models' ``load_weights`` read, and honour ``VLLM_RELOAD_MODE``), else the layerwise pair (0.16+)."""
    try:
        from vllm.model_executor.model_loader import reload
    except ImportError:
        return None
    start, finish = getattr(reload, "start_reload", None), getattr(reload, "finish_reload", None)
    if callable(start) and callable(finish):
        return start, lambda model, runner: finish(model, runner.model_config, getattr(runner, "device", None))
    init, final = getattr(reload, "initialize_layerwise_reload", None), getattr(reload, "finalize_layerwise_reload", None)
    if not (callable(init) and callable(final)):
        return None
    return init, lambda model, runner: final(model, runner.model_config)


def _cap_lifted(runner, model):
    """vLLM 0.34's own reload lends the push room: ``kv_cache_lent_for_weight_update`` lifts the torch cap the
    extensible KV cache set (``shim.vllm.sleep.extensible_kv``) for the update; a null context elsewhere."""
    kv_cache = getattr(runner, "extensible_kv_cache", None)
    if kv_cache is None:
        return contextlib.nullcontext()
    try:
        from vllm.v1.worker.extensible_kv_cache import kv_cache_lent_for_weight_update

        return kv_cache_lent_for_weight_update(kv_cache, model, reclaimable=False, fail_if_short=False)
    except Exception:
        return contextlib.nullcontext()


def _plain_snapshot(model) -> list:
    return [(owner, name, tensor) for owner, name, tensor, _ in tensors.plain_tensors(model)]


def _same_layout(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.stride() == b.stride()


def _put_back(snapshot) -> int:
    """Re-derived plain attributes copied into their old storage; returns how many stayed new."""
    import torch

    moved = 0
    with torch.no_grad():
        for owner, name, old in snapshot:
            new = vars(owner).get(name)
            if new is old or not isinstance(new, torch.Tensor):
                continue
            if not _same_layout(old, new):
                moved += 1
                continue
            if new.data_ptr() != old.data_ptr():
                old.copy_(new)
            setattr(owner, name, old)
    return moved


def _touched_attention(model, written: set) -> list:
    """Attention layers whose own parameters or ``kv_b_proj`` (on the layer or its ``impl``) were written."""
    classes = tensors.attention_classes()
    out = []
    for module in model.modules() if classes else ():
        if not isinstance(module, classes):
            continue
        params = list(module.parameters())
        kv_b_proj = getattr(getattr(module, "impl", None), "kv_b_proj", None)
        if kv_b_proj is not None and hasattr(kv_b_proj, "parameters"):
            params += list(kv_b_proj.parameters())
        if any(id(p) in written for p in params):
            out.append(module)
    return out


def _reprocess(module, dtype) -> None:
    """``module.process_weights_after_loading`` called with the signature its class has: ``(act_dtype)`` up to
    vLLM 0.33 (``Attention`` / ``MLAAttention``), no argument from 0.34 (the layer reads its own
    ``act_dtype``). First, as vLLM's reload (``_reload_attention_scales``), where the layer still holds its
    KV-cache scale parameters (0.34 keeps them after the load), its KV-cache quant method derives the scales
    the kernels read (``_k_scale``, ``_k_scale_float``, ...) from them again."""
    from shim.engine import call_args

    method = getattr(module, "quant_method", None)
    if method is not None and hasattr(module, "k_scale"):
        method.process_weights_after_loading(module)
    hook = module.process_weights_after_loading
    try:
        call_args.signature(hook).bind(dtype)
        takes_dtype = True
    except TypeError:  # takes no dtype (0.34)
        takes_dtype = False
    except ValueError:  # no signature to read: the older form
        takes_dtype = True
    if takes_dtype:
        hook(dtype)
    else:
        hook()


class _Push:
    """One push into ``model``: ``model.load_weights`` is wrapped (an instance attribute) for its duration.
    The first call opens vLLM's layerwise reload -- not before: the trainer's ``wake_up(["weights"])`` comes
    first, and vLLM's level-2 buffer restore in it must find the real buffers, not the meta tensors the
    reload puts in their place -- and every call records the parameters it reports loaded."""

    def __init__(self, model, layerwise):
        self.model, self.layerwise = model, layerwise
        self.opened = False
        self.written: set = set()
        self._by_name = None

    def load_weights(self, original, weights, *args, **kwargs):
        if self.layerwise is not None and not self.opened:
            try:
                self.layerwise[0](self.model)
                self.opened = True
            except Exception as exc:  # vLLM's internals changed: the push goes in raw, as without the shim
                self.layerwise = None
                log.warning_once(("reload", "layerwise-failed"),
                                 f"vLLM's initialize_layerwise_reload failed ({type(exc).__name__}: {exc}): pushes "
                                 f"are written raw, what process_weights_after_loading derives is not refreshed")
        loaded = original(weights, *args, **kwargs)
        if self.layerwise is None:
            if self._by_name is None:
                self._by_name = dict(self.model.named_parameters())
            for name in loaded or ():
                param = self._by_name.get(name)
                if param is not None:
                    self.written.add(id(param))
        return loaded

    @contextlib.contextmanager
    def installed(self):
        model, original = self.model, self.model.load_weights

        def load_weights(weights, *args, **kwargs):
            return self.load_weights(original, weights, *args, **kwargs)

        model.load_weights = load_weights
        try:
            yield
        finally:
            try:
                del model.load_weights  # the instance attribute: the class's method shows again
            except AttributeError:
                model.load_weights = original


@contextlib.contextmanager
def session(llm):
    """Around ONE trainer push into ``llm``: vLLM's reload (0.34: ``start_reload``/``finish_reload``, the torch
    cap lifted as vLLM's own reload does; 0.16+: the layerwise pair) or, before it, the touched attention
    layers re-processed; re-derived plain attributes back in their old storage. Where the
    engine cannot be reached, a session is already open on it, or the model derives nothing from its
    weights (:func:`needs_reprocess`: a dense unquantized model), the push runs as it is."""
    runner = runner_of(llm)
    model = getattr(runner, "model", None)
    if model is None or vars(model).get(IN_SESSION) or not needs_reprocess(model):
        yield
        return
    snapshot = _plain_snapshot(model)
    push = _Push(model, _layerwise())
    setattr(model, IN_SESSION, True)
    try:
        with push.installed(), _cap_lifted(runner, model):
            try:
                yield
            finally:
                if push.opened:
                    push.layerwise[1](model, runner)
        if not push.opened:
            for module in _touched_attention(model, push.written):
                _reprocess(module, runner.model_config.dtype)
    finally:
        setattr(model, IN_SESSION, False)
        moved = _put_back(snapshot)
    if moved:
        log.debug(f"push re-derived {moved} plain tensor(s) with a new shape or dtype: they stay outside the "
                  f"storage they had (and the sleep pool)")
    if push.opened or push.written:
        setattr(model, tensors.REPROCESSED, True)
