"""A LoRA adapter in vLLM's own LoRA manager, compared with the adapter the trainer pushed.

With vLLM's LoRA on (ms-swift ``--vllm_enable_lora``, verl's adapter updates) a push goes to ``add_lora``, not
the model's weights, so comparing the weights alone would call a wrong or missing adapter verified. Engine side
(:func:`engine_digests`, on each worker): digests of one adapter's tensors in the manager and of the device slots
the forward reads (:func:`slot_tensors`). Trainer side (:func:`compare`): the same tensors made from what the
trainer pushed as vLLM makes them (:func:`expected`), digested the same way; every tensor at every check
(adapters are small). A module the engine's adapter lacks is equal where the trainer's adapter adds nothing there
(``lora_B`` zero, PEFT's initialisation).
"""
from __future__ import annotations


class NoManager(LookupError):
    """The engine has no LoRA manager (vLLM's LoRA off): the adapter cannot be compared."""


def _adapters(manager) -> dict:
    """``{id: LoRAModel}`` of ``manager``, least recently registered or used first."""
    listed = getattr(manager, "list_adapters", None)
    return dict(listed()) if callable(listed) else dict(getattr(manager, "_registered_adapters", {}) or {})


def engine_tensors(manager, lora) -> dict:
    """``{"<module>.lora_a": tensor, "<module>.lora_b": tensor}`` of one ``LoRAModel``; a packed module
    (``PackedLoRALayerWeights``: a list per kind) under the names of the modules it packs."""
    return {name: t for name, (t, _) in _stored(manager, lora).items()}


def _stored(manager, lora) -> dict:
    """``{name: (tensor, the scaling vLLM still applies to it)}`` (1 once ``optimize()`` folded it into
    ``lora_b``), as :func:`engine_tensors` names them."""
    packed = getattr(manager, "packed_modules_mapping", None) or {}
    out = {}
    for module, weights in lora.loras.items():
        a, b, scale = weights.lora_a, weights.lora_b, getattr(weights, "scaling", 1)
        if isinstance(a, (list, tuple)):
            head, _, leaf = module.rpartition(".")
            parts = packed.get(leaf) or [f"{leaf}[{i}]" for i in range(len(a))]
            scales = scale if isinstance(scale, (list, tuple)) else [scale] * len(a)
            for part, ta, tb, sc in zip(parts, a, b, scales):
                name = f"{head}.{part}" if head else part
                if ta is not None:
                    out[f"{name}.lora_a"] = (ta, sc)
                if tb is not None:
                    out[f"{name}.lora_b"] = (tb, sc)
            continue
        out[f"{module}.lora_a"], out[f"{module}.lora_b"] = (a, scale), (b, scale)
    return out


def slot_tensors(manager, lora, tensors: dict) -> dict:
    """The device slots an active adapter was copied into (``activate_adapter`` -> ``set_lora``: ``lora_a_stacked``
    ``[max_loras, 1, max_rank, in]`` holds ``[r, in]``, ``lora_b_stacked`` ``[max_loras, 1, out, max_rank]`` holds
    ``[out, r]``), what the forward computes with: ``{"<module>.lora_a@slot<i>": view}`` for the layers of one
    unsharded slice (``tp_size`` 1, one ``lora_a_stacked``); an adapter not in a slot is copied from the manager's
    tensors when a request needs it."""
    index_to_id = list(getattr(manager, "lora_index_to_id", None) or [])
    if lora.id not in index_to_id:
        return {}
    index, rank, out = index_to_id.index(lora.id), int(lora.rank), {}
    for module, layer in (getattr(manager, "modules", None) or {}).items():
        stacked_a, stacked_b = getattr(layer, "lora_a_stacked", None), getattr(layer, "lora_b_stacked", None)
        if (f"{module}.lora_a" not in tensors or not isinstance(stacked_a, (list, tuple)) or len(stacked_a) != 1
                or not isinstance(stacked_b, (list, tuple)) or int(getattr(layer, "tp_size", 1) or 1) != 1):
            continue
        out[f"{module}.lora_a@slot{index}"] = stacked_a[0][index, 0, :rank]
        out[f"{module}.lora_b@slot{index}"] = stacked_b[0][index, 0, :, :rank]
    return out


def engine_digests(model, request: dict) -> dict:
    """Run on one worker: the adapter ``request["id"]`` (None: the most recently registered) of the model's LoRA
    manager: ``{"id", "ids", "tensors": {name: [shape, dtype]}, "digests": {name: digest}}``; ``{"id": None}``
    where none is registered."""
    from shim.verify import digest

    manager = getattr(model, "lora_manager", None)
    if manager is None:
        raise NoManager(f"{type(model).__name__} has no LoRA manager (vLLM's LoRA off?): the adapter the trainer "
                        "pushes to vLLM's LoRA cannot be compared")
    adapters = _adapters(manager)
    want = request.get("id")
    lora_id = want if want is not None else (list(adapters)[-1] if adapters else None)
    lora = adapters.get(lora_id) if lora_id is not None else None
    out = {"id": lora_id if lora is not None else None, "ids": sorted(adapters)}
    if lora is None:
        return out
    stored = {n: v for n, v in _stored(manager, lora).items() if v[0] is not None}
    tensors = {n: t for n, (t, _) in stored.items()}
    tensors.update(slot_tensors(manager, lora, tensors))
    names = sorted(tensors)
    out["tensors"] = {n: [list(tensors[n].shape), str(tensors[n].dtype).replace("torch.", "")] for n in names}
    out["scaling"] = {n: float(v[1] or 1) for n, v in stored.items()}  # not folded into lora_b: 1.0 expected
    out["digests"] = dict(zip(names, digest.digests([tensors[n].detach() for n in names])))
    return out


def expected(kind: str, tensor, shape: list, dtype: str, scaling: float):
    """What vLLM stores for a pushed PEFT tensor (``lora_A``: ``[r, in]``, ``lora_B``: ``[out, r]``).

    ``LoRAModel.from_lora_tensors`` (vLLM 0.10.2) keeps each in ``lora_dtype`` on the CPU, transposed, and
    ``optimize()`` folds the scaling into ``lora_b`` (``lora_b *= scaling``: ``lora_alpha / r``, or ``/ sqrt(r)``
    with rsLoRA); the slots hold ``[r, in]`` / ``[out, r]``. So: the engine's ``dtype`` on the CPU, transposed
    where the engine's ``shape`` says so (a square one as 0.10.2 stores it), ``lora_b`` times ``scaling`` (the
    caller passes 1 where the engine's weights keep their scaling apart, not folded)."""
    import torch

    x = tensor.detach().to(device="cpu", dtype=getattr(torch, dtype))
    if list(x.shape) != shape or (x.dim() == 2 and x.shape[0] == x.shape[1]):
        x = x.t()
    if list(x.shape) != shape:
        return None
    if kind == "lora_b" and scaling != 1:
        x = x.clone()
        x *= scaling
    return x


def _no_op(a, b) -> bool:
    """A module's adapter that adds nothing (``lora_A`` or ``lora_B`` all zero: PEFT initialises ``lora_B`` so)."""
    return not (bool(a.detach().ne(0).any()) and bool(b.detach().ne(0).any()))


def compare(results: list, pushed: dict, tag: str = "LoRA adapter") -> list:
    """Adapter tensors whose engine digests differ from what ``pushed`` gives (``{module: (lora_A weight,
    lora_B weight, scaling)}``, the trainer's modules by vLLM module name), on every worker: ``"<module>.lora_b
    (<tag> <id>)"``; a module pushed that the engine's adapter lacks, or the reverse, is named too."""
    from shim.verify import digest

    differ = []
    for r in results:
        got = r.get("lora") or {}
        rank = r.get("rank", 0)
        where = f"{tag} {got.get('id')}{f', tp rank {rank}' if len(results) > 1 or rank else ''}"
        if got.get("id") is None:
            if not all(_no_op(a, b) for a, b, _ in pushed.values()):
                ids = got.get("ids") or []
                differ.append(f"(no {tag} in vLLM's LoRA manager{f'; it holds {ids}' if ids else ''})")
            continue
        tensors, digests = got["tensors"], got["digests"]
        made, names = [], []
        for module, (a, b, _) in sorted(pushed.items()):
            for kind in ("lora_a", "lora_b"):
                if f"{module}.{kind}" not in tensors and not _no_op(a, b):  # computes with the base alone
                    differ.append(f"{module}.{kind} ({where}: pushed, not in the engine's adapter)")
        for name in sorted(tensors):
            module, kind = name.split("@")[0].rsplit(".", 1)
            if module not in pushed:
                differ.append(f"{name} ({where}: in the engine's adapter, not pushed)")
                continue
            a, b, scaling = pushed[module]
            t = a if kind == "lora_a" else b
            left = (got.get("scaling") or {}).get(name.split("@")[0], 1.0)  # what vLLM still multiplies by
            if left != 1.0 and left != scaling:
                differ.append(f"{name} ({where}: scaling {left}, pushed {scaling})")
                continue
            x = expected(kind, t, *tensors[name], scaling if left == 1.0 else 1.0)
            if x is None:
                differ.append(f"{name} ({where}: shape {tensors[name][0]}, pushed {list(t.shape)})")
                continue
            made.append(x)
            names.append(name)
        for name, d in zip(names, digest.digests(made)):
            if d != digests[name]:
                differ.append(f"{name} ({where})")
    return differ
