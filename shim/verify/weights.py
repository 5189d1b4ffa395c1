"""Weight verification (``SHIM_VERIFY_WEIGHTS``): the engine's weights against the trainer's, before each generate.

Whatever the cause of a missing push (an upstream bug, a patch switched off or
standing down, a new trainer release), a colocated engine that samples from
other weights than the trainer holds produces rollouts of the wrong policy
without any error. With ``SHIM_VERIFY_WEIGHTS=1`` the shim compares, right
before vLLM samples, a fingerprint of the engine's weights with the trainer's
current weights; on a mismatch it logs one WARNING with the words ``stale
weights`` (the engine, the trainer's step, the first tensors that differ), or
raises :class:`StaleWeights` with ``SHIM_STRICT=1``.

How it is wired (explicit per-engine objects, no thread-locals):

- A trainer-side wrapper (``patches/verify_weights.py``: TRL ``VLLMGeneration.generate``,
  GRPO/RLOO ``_generate_single_turn`` 0.25-0.27, OnlineDPO, GOLD) calls :func:`armed`
  around the trainer's own generate method: it names the trainer model the engine must
  equal (a :class:`Target`, kept per engine like ``shim.vllm.sleep_state``).
- A vLLM-side wrapper (``vllm.LLM.generate`` / ``chat``) calls :func:`before_generate`:
  when its engine is armed, it verifies. It runs INSIDE every other wrapper the
  trainer or the shim put around the engine (``shim.trl.synced_llm`` pushes first), so it
  sees exactly the weights vLLM is about to sample from.

The engine is read through vLLM's worker API: in-process executors
(``llm_engine.model_executor.driver_worker.model_runner.model``: TRL/ms-swift colocate,
``external_launcher``) directly, any other executor through ``LLM.apply_model`` (one
result per worker; a multiprocess executor needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
to ship the function, else verification says once that it cannot run). Each worker
describes its own parameters (:func:`describe`): for every parameter, which trainer
tensor(s) and which slice of them it holds, from vLLM's own layer attributes
(``tp_rank``/``tp_size``, ``output_sizes`` of ``MergedColumnParallelLinear``, the head
counts and ``num_kv_head_replicas`` of ``QKVParallelLinear``, ``shard_indices`` of
``VocabParallelEmbedding``, the ``output_dim``/``input_dim`` weight attributes) and the
model's ``packed_modules_mapping`` (``qkv_proj`` = ``q_proj,k_proj,v_proj``,
``gate_up_proj`` = ``gate_proj,up_proj``). So each tensor-parallel rank compares its
own shard with the matching slice of the trainer's full tensor.

Fingerprints (the same code on both sides; the trainer's values are first rounded to
the engine's dtype, exactly what the push's ``param.copy_`` does, so a bf16 engine fed
from float32 master weights compares equal; then the BIT PATTERNS are compared, no
tolerance needed):

- ``sample`` (default, ``SHIM_VERIFY_WEIGHTS=1``): :data:`TENSORS` matrices spread
  evenly over the model (2-D or larger, trained), :data:`ELEMENTS` strided elements
  each. Cost: two tiny gathers and one device-to-host copy per side per generate.
  A push that did not land is missed only if no sampled element changed since the
  weights the engine holds: after one optimizer step at the learning rates RL uses,
  many of the 8192 sampled bf16 values change.
- ``exact``: every element of every mapped tensor, as two int64 checksums of the bit
  patterns (plain and position-weighted sums; integer arithmetic, so the reduction
  order cannot change them): any single changed element is found.

Sharded trainers: under DeepSpeed ZeRO-3 only the trainer tensors the fingerprint
reads are gathered (``deepspeed.zero.GatheredParameters``, a collective: every rank
verifies the same tensors at the same generate); FSDP2 ``DTensor`` parameters through
``full_tensor()`` (likewise). In ``exact`` mode that is every tensor, one at a time.
Not verified (one INFO line, counted as ``unverifiable``): PEFT models (the engine
holds merged adapters), FSDP1 flat parameters, engines whose parameters cannot be
matched by name (quantized or renamed), non-floating dtypes.

Counts (``counts()``): ``verified`` (generates whose fingerprint matched), ``stale``,
``unverifiable``, ``seconds`` (the shim's own time in verification). They go to
``shim.observe.events.count`` too when that API exists.
"""
from __future__ import annotations

import sys
import threading
import time
import weakref

from shim.engine import config, log
from shim.vllm import sleep_state

TENSORS = 8
"""Matrices sampled per generate in ``sample`` mode."""
ELEMENTS = 1024
"""Elements sampled per matrix in ``sample`` mode."""
WARN_FIRST = 5
"""Stale generates logged one WARNING each; after that one WARNING every :data:`WARN_EVERY`."""
WARN_EVERY = 50
SHOW = 3
"""Tensors named in a WARNING."""
CHUNK = 1 << 24
"""Elements per chunk of an exact checksum (bounds the temporary int64 copy)."""
MODULUS = 65521
DEFAULT_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
TRAINER_WRAPPERS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


class StaleWeights(RuntimeError):
    """Raised with SHIM_STRICT=1: the engine was about to sample from other weights than the trainer's."""


_lock = threading.Lock()
_counts = {"verified": 0, "stale": 0, "unverifiable": 0, "seconds": 0.0}
_times: list = []      # the shim's own seconds per verification (bench: median cost per generate)
_targets: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_names: dict = {}


def counts() -> dict:
    with _lock:
        out = dict(_counts)
        out["times"] = list(_times)
        return out


def _count(key: str, seconds: float) -> None:
    with _lock:
        _counts[key] += 1
        _counts["seconds"] += seconds
        if len(_times) < 100000:
            _times.append(seconds)
    from shim.observe import events

    counter = getattr(events, "count", None)  # the counters API (another helper's), when present
    if counter is not None:
        try:
            counter(f"rollouts_{key}")
        except Exception as exc:  # never break training over a counter
            log.debug(f"events.count failed: {exc!r}")


# ---------------------------------------------------------------------------
# engine side: layouts and fingerprints (run inside each vLLM worker)
# ---------------------------------------------------------------------------
def _leaf_replace(name: str, leaf: str, new: str) -> str:
    head, _, tail = name.rpartition(f"{leaf}.")
    return f"{head}{new}.{tail}"


def param_layout(name: str, param, module, packed: dict) -> "dict | None":
    """Which trainer tensor slices engine parameter ``name`` (held by ``module``) is made of.

    ``{"dim": d, "pieces": [[trainer_name, engine_start, length, trainer_start], ...]}``:
    along dimension ``d`` the engine's rows ``[engine_start, engine_start + length)`` are
    the trainer tensor's rows ``[trainer_start, trainer_start + length)``; every other
    dimension is equal. Mirrors the weight loaders of vLLM 0.24
    ``vllm/model_executor/layers/linear.py`` (``QKVParallelLinear.weight_loader``: q rows
    at ``tp_rank``, k/v at ``tp_rank // num_kv_head_replicas``; ``MergedColumnParallelLinear``:
    each of ``output_sizes`` split by ``tp_size``; ``ColumnParallelLinear`` along
    ``output_dim``, ``RowParallelLinear`` along ``input_dim``) and
    ``vocab_parallel_embedding.py`` (rows ``org_vocab_start_index..end``; padding unmapped).
    None: not a layout this knows (the tensor is left out)."""
    shape = list(param.shape)
    if not shape:
        return {"dim": 0, "pieces": [[name, 0, 1, 0]], "scalar": True}
    leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    tp_size = int(getattr(module, "tp_size", 1) or 1)
    tp_rank = int(getattr(module, "tp_rank", 0) or 0)
    out_dim = getattr(param, "output_dim", None)
    in_dim = getattr(param, "input_dim", None)
    parts = packed.get(leaf)
    if parts and getattr(module, "output_sizes", None) is not None and out_dim is not None:
        if len(parts) != len(module.output_sizes):
            return None
        if hasattr(module, "num_kv_head_replicas") and len(parts) == 3:  # QKVParallelLinear
            hs, vhs = module.head_size, getattr(module, "v_head_size", module.head_size)
            nh, nkv, rep = module.num_heads, module.num_kv_heads, module.num_kv_head_replicas
            kv_rank = tp_rank // rep
            sizes = [(nh * hs, tp_rank), (nkv * hs, kv_rank), (nkv * vhs, kv_rank)]
        else:  # MergedColumnParallelLinear
            sizes = [(size // tp_size, tp_rank) for size in module.output_sizes]
        pieces, start = [], 0
        for part, (size, rank) in zip(parts, sizes):
            pieces.append([_leaf_replace(name, leaf, part), start, size, rank * size])
            start += size
        if start != shape[out_dim]:
            return None
        return {"dim": out_dim, "pieces": pieces}
    if parts:  # a packed name this layer shape does not explain
        return None
    indices = getattr(module, "shard_indices", None)
    if indices is not None and out_dim is not None:  # VocabParallelEmbedding / ParallelLMHead
        start, end = indices.org_vocab_start_index, indices.org_vocab_end_index
        return {"dim": out_dim, "pieces": [[name, 0, end - start, start]]}
    if tp_size > 1 and out_dim is not None and hasattr(module, "output_size_per_partition") \
            and not hasattr(module, "input_is_parallel"):  # ColumnParallelLinear (weight and bias)
        n = shape[out_dim]
        return {"dim": out_dim, "pieces": [[name, 0, n, tp_rank * n]]}
    if tp_size > 1 and in_dim is not None and hasattr(module, "input_is_parallel"):  # RowParallelLinear
        n = shape[in_dim]
        return {"dim": in_dim, "pieces": [[name, 0, n, tp_rank * n]]}
    return {"dim": 0, "pieces": [[name, 0, shape[0], 0]]}  # replicated (norms, RowParallel bias, TP 1)


def _tp_rank(model) -> int:
    for module in model.modules():
        if hasattr(module, "tp_rank"):
            return int(module.tp_rank or 0)
    return 0


def describe(model) -> dict:
    """Every parameter of the engine's model: shape, dtype and layout (one worker's view)."""
    packed = dict(DEFAULT_PACKED)
    packed.update({k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()})
    owner = {}
    for _, module in model.named_modules():
        for _, param in module.named_parameters(recurse=False):
            owner.setdefault(id(param), module)
    params = {}
    for name, param in model.named_parameters():  # tied parameters once, under their first name
        params[name] = {"shape": list(param.shape), "dtype": str(param.dtype).replace("torch.", ""),
                        "layout": param_layout(name, param, owner[id(param)], packed)}
    return {"rank": _tp_rank(model), "params": params}


_BITS = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64",
         "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8", "float8_e5m2fnuz": "uint8"}


def bits(t):
    """The bit patterns of a floating tensor as int64 (``t`` contiguous or not)."""
    import torch

    return t.contiguous().view(getattr(torch, _BITS[str(t.dtype).replace("torch.", "")])).to(torch.int64)


def checksum(t) -> list:
    """``[sum, position-weighted sum]`` of the bit patterns of every element (int64, wraps)."""
    import torch

    flat = t.reshape(-1)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    weighted = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), CHUNK):
        b = bits(flat[start:start + CHUNK])
        w = torch.arange(start, start + b.numel(), device=b.device, dtype=torch.int64) % MODULUS + 1
        total += b.sum()
        weighted += (b * w).sum()
    return [total, weighted]


def sample_positions(numel: int, n: int):
    """Flat indices of a fixed strided sample of ``n`` elements (all when ``numel <= n``)."""
    import torch

    if numel <= n:
        return torch.arange(numel, dtype=torch.int64)
    stride = numel // n
    return torch.arange(n, dtype=torch.int64) * stride + stride // 2


def fingerprint(model, request: dict) -> dict:
    """Run on one worker: ``request = {"mode", "names", "elements", "describe"}``.

    ``sample``: ``values`` = bit patterns at :func:`sample_positions` of each named shard,
    concatenated; ``exact``: ``sums`` = one :func:`checksum` per layout piece of each."""
    import torch

    out = {"rank": _tp_rank(model)}
    if request.get("describe"):
        out["describe"] = describe(model)
    names = request.get("names") or []
    if not names:
        return out
    params = dict(model.named_parameters())
    with torch.no_grad():
        if request["mode"] == config.VERIFY_EXACT:
            layouts = out["describe"]["params"] if "describe" in out else describe(model)["params"]
            sums = []
            for name in names:
                p, layout = params[name], layouts[name]["layout"]
                for _, e_start, length, _ in layout["pieces"]:
                    piece = p.reshape(1) if layout.get("scalar") else p.narrow(layout["dim"], e_start, length)
                    sums.extend(checksum(piece))
            out["sums"] = torch.stack(sums).cpu().tolist() if sums else []
        else:
            picks = []
            for name in names:
                p = params[name].reshape(-1)
                idx = sample_positions(p.numel(), request["elements"]).to(p.device)
                picks.append(bits(p.index_select(0, idx)))
            out["values"] = torch.cat(picks).cpu() if picks else torch.zeros(0, dtype=torch.int64)
    return out


# ---------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------
def trainer_name(name: str) -> str:
    """A trainer parameter's name as the push gives it to vLLM (TRL ``_fix_param_name_to_vllm``)."""
    for wrapper in TRAINER_WRAPPERS:
        name = name.replace(wrapper, "")
    return name[len("module."):] if name.startswith("module.") else name


def trainer_params(model) -> dict:
    params = {}
    for name, p in model.named_parameters():
        params.setdefault(trainer_name(name), p)
    if "lm_head.weight" not in params and "model.embed_tokens.weight" in params:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]  # tied embeddings
    return params


def unverifiable_reason(model) -> "str | None":
    if getattr(model, "peft_config", None) is not None or hasattr(model, "merge_adapter"):
        return "PEFT model (the engine holds the merged adapters)"
    for name, p in model.named_parameters():
        if "_flat_param" in name or type(p).__name__ == "FlatParameter":
            return "FSDP1 flat parameters"
        break
    return None


class _Gathered:
    """Full trainer tensors for the names given: ZeRO-3 gathered, FSDP2 DTensor made whole."""

    def __init__(self, params: dict, names):
        self.params = params
        self.names = list(dict.fromkeys(names))
        self._ctx = None

    def __enter__(self) -> dict:
        sharded = [self.params[n] for n in self.names if hasattr(self.params[n], "ds_id")]
        if sharded:
            import deepspeed

            self._ctx = deepspeed.zero.GatheredParameters(sharded, modifier_rank=None)
            self._ctx.__enter__()
        out = {}
        for n in self.names:
            p = self.params[n]
            full = getattr(p, "full_tensor", None)  # FSDP2 DTensor (collective)
            out[n] = (full() if callable(full) else p).detach()
        return out

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


def _ravel_map(idx, shape: list, layout: dict, tensors: dict) -> list:
    """Engine flat positions -> ``[(mask, trainer_name, trainer_flat)]`` through the layout."""
    import torch

    dim = layout["dim"]
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    coords = [(idx // strides[k]) % shape[k] for k in range(len(shape))]
    out = []
    for tname, e_start, length, t_start in layout["pieces"]:
        t = tensors[tname]
        tshape = list(t.shape) if t.dim() else [1]
        if len(tshape) != len(shape) or any(tshape[k] != shape[k] for k in range(len(shape)) if k != dim) \
                or t_start + length > tshape[dim]:
            raise LookupError(f"{tname}: trainer shape {tshape} does not hold engine slice {shape} dim {dim}")
        c = coords[dim]
        mask = (c >= e_start) & (c < e_start + length)
        flat = torch.zeros_like(idx)
        tstr = 1
        for k in range(len(shape) - 1, -1, -1):
            ck = (c - e_start + t_start) if k == dim else coords[k]
            flat += ck * tstr
            tstr *= tshape[k]
        out.append((mask, tname, flat))
    return out


class _Plan:
    """Where the engine's sampled elements of one tensor lie in the trainer's tensors (computed once)."""

    def __init__(self, desc: dict, tensors: dict, elements: int):
        import torch

        shape = desc["shape"] or [1]
        numel = 1
        for s in shape:
            numel *= s
        idx = sample_positions(numel, elements)
        self.n = idx.numel()
        self.dtype = getattr(torch, desc["dtype"])
        self.covered = torch.zeros(self.n, dtype=torch.bool)
        self.pieces = []
        for mask, tname, flat in _ravel_map(idx, shape, desc["layout"], tensors):
            if bool(mask.any()):
                self.pieces.append((mask.nonzero().reshape(-1), tname, flat[mask]))
                self.covered |= mask
        self._on: dict = {}

    def expected(self, tensors: dict):
        """The trainer's bit patterns (rounded to the engine's dtype) at the sample, on the trainer's device."""
        import torch

        device = tensors[self.pieces[0][1]].device if self.pieces else "cpu"
        want = torch.zeros(self.n, dtype=torch.int64, device=device)
        for k, (pos, tname, flat) in enumerate(self.pieces):
            t = tensors[tname].reshape(-1)
            key = (k, str(t.device))
            if key not in self._on:  # index tensors moved to the trainer's device once
                self._on[key] = (pos.to(device), flat.to(t.device))
            p, f = self._on[key]
            want.index_copy_(0, p, bits(t.index_select(0, f).to(self.dtype)).to(device))  # no host sync
        return want


def expected_sums(desc: dict, tensors: dict) -> list:
    """The trainer's :func:`checksum` per layout piece (device tensors), rounded to the engine's dtype first."""
    import torch

    layout, dtype = desc["layout"], getattr(torch, desc["dtype"])
    sums = []
    for tname, e_start, length, t_start in layout["pieces"]:
        t = tensors[tname]
        piece = t.reshape(1) if layout.get("scalar") else t.narrow(layout["dim"], t_start, length)
        sums.extend(checksum(piece.to(dtype)))
    return sums


def _select(desc: dict, params: dict, mode: str) -> list:
    """Engine parameter names to compare: all mapped ones (exact) or TENSORS matrices spread evenly."""
    mapped = []
    for name, d in desc["params"].items():
        layout = d["layout"]
        if layout is None or d["dtype"] not in _BITS:
            continue
        tnames = [piece[0] for piece in layout["pieces"]]
        if not all(t in params for t in tnames):
            continue
        if mode == config.VERIFY_SAMPLE and (len(d["shape"]) < 2
                                             or not all(params[t].requires_grad for t in tnames)):
            continue
        mapped.append(name)
    if mode == config.VERIFY_EXACT or len(mapped) <= TENSORS:
        return mapped
    step = len(mapped) / TENSORS
    return [mapped[int(i * step + step / 2)] for i in range(TENSORS)]


def compare(results: list, descs: dict, names_by_rank: dict, params: dict, mode: str, plans: "dict | None" = None) -> list:
    """Tensors (``"name (tp rank r)"``) whose fingerprint differs from the trainer's, on every worker.

    ``plans`` (kept by the caller between generates) caches the sample's index maps."""
    import torch

    plans = {} if plans is None else plans
    differ = []
    if mode == config.VERIFY_EXACT:  # every tensor: gathered one at a time (ZeRO-3 / FSDP2), one host copy
        for r in results:
            rank, desc = r["rank"], descs[r["rank"]]
            tag = f" (tp rank {rank})" if len(results) > 1 or rank else ""
            sums, spans = [], []
            for name in names_by_rank[rank]:
                d = desc["params"][name]
                with torch.no_grad(), _Gathered(params, [piece[0] for piece in d["layout"]["pieces"]]) as tensors:
                    start = len(sums)
                    for x in expected_sums(d, tensors):
                        sums.append(x.to(sums[0].device) if sums else x)
                spans.append((name, start, len(sums)))
            want = torch.stack(sums).cpu().tolist() if sums else []
            got = list(r.get("sums") or [])
            for name, a, b in spans:
                if got[a:b] != want[a:b]:
                    differ.append(name + tag)
        return differ
    needed = set()
    for r in results:
        desc = descs[r["rank"]]
        for name in names_by_rank[r["rank"]]:
            needed.update(piece[0] for piece in desc["params"][name]["layout"]["pieces"])
    with torch.no_grad(), _Gathered(params, sorted(needed)) as tensors:
        for r in results:
            rank, desc = r["rank"], descs[r["rank"]]
            tag = f" (tp rank {rank})" if len(results) > 1 or rank else ""
            names = names_by_rank[rank]
            todo = []
            for name in names:
                key = (rank, name)
                if key not in plans:
                    plans[key] = _Plan(desc["params"][name], tensors, ELEMENTS)
                todo.append(plans[key])
            if not todo:
                continue
            want = torch.cat([p.expected(tensors) for p in todo]).cpu()
            got = torch.as_tensor(r.get("values"), dtype=torch.int64).reshape(-1)
            if got.numel() != want.numel():
                differ.extend(n + tag for n in names)
                continue
            pos = 0
            for name, plan in zip(names, todo):
                mine, theirs = got[pos:pos + plan.n], want[pos:pos + plan.n]
                pos += plan.n
                if not torch.equal(mine[plan.covered], theirs[plan.covered]):
                    differ.append(name + tag)
    return differ


# ---------------------------------------------------------------------------
# reaching the workers
# ---------------------------------------------------------------------------
def _unwrap(llm):
    seen = 0
    while hasattr(llm, "__wrapped__") and seen < 8:
        llm = llm.__wrapped__
        seen += 1
    return llm


def vllm_engine(llm):
    """vLLM's engine behind ``llm``: ``LLM.llm_engine``, ms-swift's ``VllmEngine.engine``, or ``llm``."""
    llm = _unwrap(llm)
    engine = getattr(llm, "llm_engine", None)
    if engine is None:
        inner = getattr(llm, "engine", None)
        engine = inner if getattr(inner, "model_executor", None) is not None else llm
    return engine


def weights_asleep(llm) -> bool:
    executor = getattr(vllm_engine(llm), "model_executor", None)
    tags = getattr(executor, "sleeping_tags", None)
    if isinstance(tags, (set, frozenset, list, tuple)):
        return "weights" in tags and bool(getattr(executor, "is_sleeping", True))
    return sleep_state.state_for(vllm_engine(llm)).weights_asleep


def in_process_model(llm):
    """The model of an in-process driver worker, or None (multiprocess executors)."""
    engine = vllm_engine(llm)
    worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
    worker = getattr(worker, "worker", None) or worker  # WorkerWrapperBase (older vLLM)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        return None
    get_model = getattr(runner, "get_model", None)  # unwraps vLLM's CUDA-graph wrapper
    return get_model() if callable(get_model) else getattr(runner, "model", None)


def run_on_workers(llm, request: dict) -> list:
    """:func:`fingerprint` on every worker of ``llm``: in process, else ``LLM.apply_model``."""
    import functools

    model = in_process_model(llm)
    if model is not None:
        return [fingerprint(model, request)]
    llm = _unwrap(llm)
    apply_model = getattr(llm, "apply_model", None) or getattr(getattr(llm, "llm_engine", None), "apply_model", None)
    if apply_model is None:
        raise LookupError(f"{type(llm).__name__} has neither an in-process worker nor apply_model")
    return list(apply_model(functools.partial(_fingerprint_of, request=request)))


def _fingerprint_of(model, request):
    return fingerprint(model, request)


# ---------------------------------------------------------------------------
# per engine: what it must equal, and the check
# ---------------------------------------------------------------------------
class Target:
    """One colocated engine's verification: the trainer model it must equal while armed."""

    def __init__(self, site: str):
        self.site = site
        self.model_ref = None
        self.armed = 0
        self.descs = None          # rank -> describe()
        self.names = None          # rank -> engine names compared
        self.mode = None
        self.disabled = ""         # why this engine cannot be verified (said once)
        self.generates = 0
        self.stale = 0
        self.params = None         # the trainer's parameters by pushed name
        self.plans: dict = {}      # (rank, name) -> _Plan

    def model(self):
        return self.model_ref() if self.model_ref is not None else None


def _key(llm):
    return vllm_engine(llm)


def target_for(llm, create: bool = False, site: str = "") -> "Target | None":
    key = _key(llm)
    with _lock:
        try:
            t = _targets.get(key)
            if t is None and create:
                t = _targets[key] = Target(site)
        except TypeError:
            return None
    return t


class armed:
    """``with armed(llm, model, site):`` around a trainer's generate: the engine must equal ``model``."""

    def __init__(self, llm, model, site: str):
        self.target = None
        if llm is None or model is None:
            return
        self.target = target_for(llm, create=True, site=site)
        if self.target is not None:
            self.target.site = site
            try:
                self.target.model_ref = weakref.ref(model)
            except TypeError:
                self.target.model_ref = lambda m=model: m

    def __enter__(self):
        if self.target is not None:
            self.target.armed += 1
        return self.target

    def __exit__(self, *exc):
        if self.target is not None:
            self.target.armed -= 1
        return False


def engine_name(llm) -> str:
    state = sleep_state.state_for(vllm_engine(llm))
    if state.engine:
        return state.engine
    key = id(_key(llm))
    if key not in _names:
        _names[key] = f"{type(_key(llm)).__name__}#{len(_names) + 1}"
    return _names[key]


def trainer_step() -> "int | None":
    """The global step of the transformers ``Trainer`` up the call stack (only read for a WARNING)."""
    frame = sys._getframe(1)
    for _ in range(60):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        step = getattr(getattr(owner, "state", None), "global_step", None)
        if isinstance(step, int):
            return step
        frame = frame.f_back
    return None



def before_generate(llm) -> None:
    """Called by the ``LLM.generate``/``chat`` wrapper: verify when a trainer armed this engine."""
    target = target_for(llm)
    if target is None or target.armed <= 0 or target.disabled:
        return
    try:
        mode = config.verify_weights()
    except config.ConfigError:
        return
    if not mode:
        return
    t0 = time.perf_counter()
    try:
        differ = _verify(llm, target, mode)
    except StaleWeights:
        raise
    except Exception as exc:  # the check must never stop training
        target.disabled = f"{type(exc).__name__}: {exc}"
        log.warning(f"verify-weights {engine_name(llm)}: cannot verify ({target.disabled}); "
                    "verification is off for this engine")
        _count("unverifiable", time.perf_counter() - t0)
        return
    seconds = time.perf_counter() - t0
    if differ is None:
        _count("unverifiable", seconds)
        return
    target.generates += 1
    if not differ:
        _count("verified", seconds)
        log.debug(f"verify-weights {engine_name(llm)}: weights equal the trainer's ({mode}, {seconds * 1e3:.2f} ms)")
        return
    target.stale += 1
    _count("stale", seconds)
    _report_stale(llm, target, differ, mode)


def _verify(llm, target: Target, mode: str) -> "list | None":
    model = target.model()
    if model is None:
        return None
    name = engine_name(llm)
    if weights_asleep(llm):
        return ["(all: the engine's weights are asleep at generate)"]
    if target.descs is None or target.mode != mode:
        reason = unverifiable_reason(model)
        if reason:
            target.disabled = reason
            log.info(f"verify-weights {name}: not verified: {reason}")
            return None
        results = run_on_workers(llm, {"describe": True})
        target.descs = {r["rank"]: r["describe"] for r in results}
        params = trainer_params(model)
        target.names = {rank: _select(d, params, mode) for rank, d in target.descs.items()}
        target.mode = mode
        target.params = params
        target.plans = {}
        total = sum(len(d["params"]) for d in target.descs.values())
        chosen = sum(len(v) for v in target.names.values())
        if not chosen:
            target.disabled = "no engine parameter matches a trainer parameter by name"
            log.info(f"verify-weights {name}: not verified: {target.disabled}")
            return None
        what = "every element" if mode == config.VERIFY_EXACT else f"{ELEMENTS} strided elements each"
        log.info(f"verify-weights {name} ({target.site}): comparing {chosen} of {total} engine tensors "
                 f"({what}, {len(target.descs)} worker(s)) with the trainer's before each generate")
    results = run_on_workers(llm, {"mode": mode, "names": _names_for_request(target), "elements": ELEMENTS})
    return compare(results, target.descs, target.names, target.params, mode, target.plans)


def _names_for_request(target: Target) -> list:
    # Every worker holds the same parameter names (its own shards): the selection of rank 0 is everyone's.
    first = min(target.names)
    return target.names[first]


def _report_stale(llm, target: Target, differ: list, mode: str) -> None:
    step = trainer_step()
    shown = ", ".join(differ[:SHOW]) + (f" and {len(differ) - SHOW} more" if len(differ) > SHOW else "")
    message = (f"verify-weights {engine_name(llm)} ({target.site}): stale weights at step "
               f"{'?' if step is None else step}: the engine is about to generate from weights that differ from "
               f"the trainer's ({mode} fingerprint; first differing: {shown}); "
               f"stale at {target.stale} of {target.generates} verified generates of this engine. "
               "A weight push did not land: check `python -m shim status` (a patch disabled or standing down?)")
    if config.strict():
        raise StaleWeights("[shim] " + message)
    if target.stale <= WARN_FIRST or target.stale % WARN_EVERY == 0:
        if target.stale == WARN_FIRST:
            message += f"; further stale generates of this engine are logged every {WARN_EVERY}"
        log.warning(message)
    else:
        log.debug(message)
