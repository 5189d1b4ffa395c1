"""Weight verification of verl's weight updates (``SHIM_VERIFY_WEIGHTS``): what the trainer streamed, checked
in the engine after ``ServerAdapter.update_weights``.

verl (0.7.1 - 0.9.1, read in the wheels) runs vLLM's ``AsyncLLM`` in a Ray actor (``vLLMHttpServer``,
``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) and streams each update into the workers'
``model.load_weights``; a tensor that does not land (verl#7904: garbled rollouts from the second update) says
nothing. Three parts, one per process: trainer (:func:`update_weights_wrapper`), rollout server
(:func:`collective_rpc_wrapper`), vLLM worker (:func:`worker_digests`); a partial or bucketed update is not a
false alarm (:meth:`Update.differing`). Never silently off: the server half or the worker method missing (the
shim not active in the Ray actor or the engine's processes: run verl under ``python -m shim``), a failed check:
one WARNING ``unverifiable`` per reason, each such update counted ``unverifiable``, the update itself unchanged.
"""
from __future__ import annotations

import time
import types
import weakref

from shim.engine import call_args, config, log
from shim.verl.verify_rpc import NO_SERVER_HALF, SITE, WORKER_METHOD, Watch, ask, unverifiable

SKIPPED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
"""Suffixes of names vLLM's ``load_weights`` skips by design (e.g. ``LlamaForCausalLM.load_weights``)."""

_engines: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # ServerAdapter -> Engine


# ---------------------------------------------------------------------------
# vLLM worker
# ---------------------------------------------------------------------------
def worker_digests(self, request: dict) -> dict:
    """``Worker.shim_weight_digests(request)``: :func:`shim.verify.compare.fingerprint` of this worker's model.

    Set on ``vllm.v1.worker.gpu_worker.Worker``: the digests, computed in the process that holds the
    weights (a method by name: vLLM ships no function without ``VLLM_ALLOW_INSECURE_SERIALIZATION``, which
    verl does not set).
    """
    from shim.verify import compare, transport

    return compare.fingerprint(transport.runner_model(self.model_runner), request)


class WorkerMethod:
    """What the record puts at ``Worker.shim_weight_digests``: a descriptor whose instances get
    :func:`worker_digests` bound. Not a function: the method is the shim's own (no upstream attribute under it),
    so a function wrapper stacked on it by someone else could not be re-pointed to anything when the shim is
    removed; a descriptor on the class is not callable, nobody wraps it, and the removal is exact."""

    def __get__(self, instance, owner=None):
        return self if instance is None else types.MethodType(worker_digests, instance)


# ---------------------------------------------------------------------------
# rollout server (the Ray actor)
# ---------------------------------------------------------------------------
def collective_rpc_wrapper(wrapped, instance, args, kwargs):
    """``vLLMHttpServer.collective_rpc``: the shim's own method returns the workers' results.

    verl's ``vLLMHttpServer.collective_rpc`` awaits the engine's ``collective_rpc`` and returns nothing
    (0.7.1/0.8.0 line 198, 0.9.0 line 219, 0.9.1 line 256); for the shim's own method only
    (:data:`WORKER_METHOD`) this returns the workers' results; every other call is verl's. The actor runs
    this wrapper only because the shim's method wrappers pickle by name (``shim.engine.patcher``): Ray ships
    the actor class by value, with each method read off the class at ``ray.remote`` in the driver.
    """
    if instance is None or call_args.arg(wrapped, args, kwargs, "method") != WORKER_METHOD:
        return wrapped(*args, **kwargs)

    async def run():
        return await instance.engine.collective_rpc(
            method=WORKER_METHOD, timeout=call_args.arg(wrapped, args, kwargs, "timeout"),
            args=tuple(call_args.arg(wrapped, args, kwargs, "args", ()) or ()),
            kwargs=call_args.arg(wrapped, args, kwargs, "kwargs"))

    return run()


# ---------------------------------------------------------------------------
# trainer
# ---------------------------------------------------------------------------
class Engine:
    """One rollout server's engine as the trainer rank sees it: its workers' descriptions, what was found."""

    def __init__(self):
        self.descs = None      # rank -> layout.describe() of that worker
        self.index = None      # trainer name -> [(rank, engine name, piece number)]
        self.owned = None      # engine names of rank 0
        self.unmapped = []     # engine parameters left out: "name (why)" (rank 0's; not verified)
        self.left_out = []     # those parameters' names (every worker's)
        self.absorbed = set()  # trainer names a parameter left out holds (streamed: not reported as missing)
        self.prefixes = ()     # modules of parameters of unknown layout (every name under them: likewise)
        self.updates = 0
        self.stale = 0
        self.disabled = ""


class Update(Watch):
    """One ``update_weights`` call: digests of what streamed (:meth:`Watch.watch`), then the check."""

    def __init__(self, engine: Engine, mode: str):
        self.engine, self.mode = engine, mode
        self.want: dict = {}        # (rank, engine name, piece) -> digest of the streamed slice
        self.unmatched: list = []   # streamed names no engine parameter holds
        self.failed = ""
        self.seconds = 0.0
        self.stale: set = set()     # (rank, engine name) found not to hold what streamed
        from shim.verify import compare

        self.spec = None if mode == config.VERIFY_EXACT else [compare.ELEMENTS, engine.updates]

    def take(self, name: str, tensor) -> None:
        self._digest(name, tensor)

    def _digest(self, name: str, tensor) -> None:
        import torch

        from shim.verify import compare, digest, layout

        name = layout.trainer_name(name)
        targets = self.engine.index.get(name)
        if not targets:
            if not _skipped(name, self.engine):
                self.unmatched.append(name)
            return
        views, dtypes = [], []
        for rank, engine_name, k in targets:
            d = self.engine.descs[rank]["params"][engine_name]
            lay = d["layout"]
            view = layout.trainer_view(tensor.detach(), lay, lay["pieces"][k])
            views.append(compare.rows(view, *self.spec) if self.spec else view)
            dtypes.append(getattr(torch, d["dtype"]))
        for key, value in zip(targets, digest.digests(views, dtypes)):
            self.want[key] = value

    def differing(self, results: list, names: list) -> list:
        """Streamed tensors whose engine digests are not the streamed ones (``"name (tp rank r)"``).

        What is compared (a partial or bucketed update is not a false alarm): each engine parameter piece
        whose trainer tensor the update streamed; pieces no tensor of this update touched are not compared. A
        streamed tensor that no engine parameter holds is reported (``"<name> (streamed, not in the
        engine)"``), except the names vLLM's loaders skip on purpose (:data:`SKIPPED`, ``lm_head.weight`` of
        tied embeddings) and the names an engine parameter left out holds: per tensor (:func:`_index`), a
        quantized parameter (:func:`shim.verify.layout.quantized`) holds the trainer tensors its layout
        names, one of unknown layout every name under its module and those its packed name stands for; only
        those go unreported, the rule stays on for every other name (one WARNING lists the parameters left
        out, with their reasons). A fused parameter (``qkv_proj``, ``gate_up_proj``, fused experts) whose
        slices the update streamed only in part is reported too (``"<name> (<trainer tensor> not
        streamed)"``). An update that finds everything equal while the engine has parameters left out is
        ``partly_verified``, never ``verified``, with its share (:meth:`share`): the verified bytes over those
        of the parameters it compared plus every one left out. Every worker is compared with what this rank
        streamed (verl streams the same full tensors from every rank).
        """
        from shim.verify import compare

        differ = []
        for r in results:
            rank = r["rank"]
            tag = f" (tp rank {rank})" if len(results) > 1 or rank else ""
            got = r.get("digests") or []
            for i, name in enumerate(names):
                pieces = got[i] if i < len(got) else None
                lay = self.engine.descs[rank]["params"][name]["layout"]
                unsent = [p[0] for k, p in enumerate(lay["pieces"]) if (rank, name, k) not in self.want]
                if len(unsent) == len(lay["pieces"]):  # nothing of it streamed to this worker: not compared
                    continue
                if unsent:  # a fused tensor written in part: its other slices are whatever they were
                    differ.append(f"{name}{tag} ({unsent[0]}{' ...' if len(unsent) > 1 else ''} not streamed)")
                    self.stale.add((rank, name))
                    continue
                wants = [self.want[(rank, name, k)] for k in range(len(lay["pieces"]))]
                if pieces != wants:
                    differ.append(name + tag + compare.slots(lay, pieces or [], wants))
                    self.stale.add((rank, name))
        return differ + [f"{n} (streamed, not in the engine)" for n in self.unmatched]

    def share(self, names: list) -> float:
        """Verified bytes over those of the parameters compared plus every parameter left out."""
        from shim.verify import layout

        verified, _ = layout.share(self.engine.descs, names, self.stale)
        compared, _ = layout.share(self.engine.descs, names)
        left, _ = layout.share(self.engine.descs, self.engine.left_out)
        return verified / (compared + left) if compared + left else 0.0


def _skipped(name: str, engine: Engine) -> bool:
    """A streamed name no compared parameter holds that is not "missing": skipped by vLLM's loaders, or held
    by a parameter left out (per tensor: only the names that parameter holds)."""
    if name.endswith(SKIPPED) or name in engine.absorbed or name.startswith(engine.prefixes):
        return True
    return name == "lm_head.weight" and "lm_head.weight" not in engine.owned  # tied embeddings


def verifying_rank(adapter) -> bool:
    """verl's own condition for the rank that reaches the server (0.9.0 ``_has_server``; before: rollout rank 0)."""
    has = getattr(adapter, "_has_server", None)
    return bool(has) if has is not None else getattr(adapter, "rollout_rank", None) == 0


def _index(engine: Engine) -> None:
    from shim.verify import layout

    index, unmapped, left, absorbed, prefixes, first = {}, [], set(), set(), set(), min(engine.descs)
    for rank, desc in sorted(engine.descs.items()):
        for name, d in desc["params"].items():
            lay = d["layout"]
            why = d.get("skip") or ("layout not understood" if lay is None else None) or (
                d["dtype"] if d["dtype"] not in layout.FLOATING else None)
            if why:  # this parameter only: the names it holds are not "missing"; it is not verified
                left.add(name)
                if rank == first:
                    unmapped.append(f"{name} ({why})")
                if lay is not None:
                    absorbed.update(piece[0] for piece in lay["pieces"])
                else:  # every name under its module, and the names it packs (``gate_up_proj``: gate, up)
                    absorbed.update(d.get("holds") or ())
                    prefixes.add(name.rsplit(".", 1)[0] + ".")
                continue
            for k, piece in enumerate(lay["pieces"]):
                index.setdefault(piece[0], []).append((rank, name, k))
                if ".base_layer." in piece[0]:  # vLLM's LoRA layer: verl streams either name (resolve_weight_name)
                    index.setdefault(piece[0].replace(".base_layer.", "."), []).append((rank, name, k))
    engine.index, engine.unmapped, engine.left_out = index, unmapped, sorted(left)
    engine.absorbed, engine.prefixes = absorbed, tuple(sorted(prefixes))
    engine.owned = set(engine.descs[first]["params"])
    if unmapped:
        from shim.verify import weights

        verified, total = layout.share(engine.descs, [n for n in engine.owned if n not in left])
        shown = ", ".join(unmapped[:weights.SHOW]) + (" ..." if len(unmapped) > weights.SHOW else "")
        weights.warn_once(f"verl unmapped {id(engine)}", f"verify-weights ({SITE}): {len(unmapped)} engine "
                          f"tensors are not verified (quantized, or a layout the shim does not map), at most "
                          f"{100 * verified / max(total, 1):.1f}% of the engine's bytes are: {shown}; updates that "
                          "find the rest equal count as shim/rollouts_partly_verified, never verified")


async def _prepare(adapter, engine: Engine) -> bool:
    if engine.descs is not None:
        return True
    try:
        results = await ask(adapter, {"describe": True})
    except Exception as exc:  # the worker method missing: NotImplementedError / AttributeError from vLLM
        unverifiable(engine, f"the engine's workers cannot describe their weights ({type(exc).__name__}: {exc}): "
                              f"the shim's {WORKER_METHOD} (verify-weights-vllm-worker) is not active in vLLM's "
                              "worker processes")
        return False
    if not results:
        unverifiable(engine, NO_SERVER_HALF)
        return False
    engine.descs = {r["rank"]: r["describe"] for r in results}
    _index(engine)
    return True


async def _check(adapter, engine: Engine, update: Update, step) -> None:
    from shim.verify import weights

    if update.failed:
        unverifiable(engine, update.failed, disable=False)
        return
    if not update.want and not update.unmatched:  # never "verified" for a stream the shim did not see
        unverifiable(engine, "the update streamed no tensor through the shim's watch", disable=False)
        return
    names = sorted({name for (_, name, _) in update.want})
    t0 = time.perf_counter()
    results = await ask(adapter, {"names": names, "sample": update.spec})
    if not results:
        unverifiable(engine, NO_SERVER_HALF)
        return
    differ = update.differing(results, names)
    seconds = update.seconds + time.perf_counter() - t0
    engine.updates += 1
    share = update.share(names)
    if not differ:
        weights.record("partly_verified" if engine.unmapped else "verified", seconds, share)
        if log.debugging():
            log.debug(f"verify-weights ({SITE}): the engine holds the {len(names)} tensors the update streamed at "
                      f"step {'?' if step is None else step} ({update.mode}, {seconds * 1e3:.2f} ms)")
        return
    engine.stale += 1
    weights.record("stale", seconds, share)
    weights.report_stale(f"verl rollout replica {getattr(adapter, 'replica_rank', '?')}", SITE, differ, update.mode,
                         step, None, engine.stale, engine.updates,
                         "after the update the engine holds other weights than the trainer streamed", "updates")


def update_weights_wrapper(wrapped, instance, args, kwargs):
    """``ServerAdapter.update_weights``: digest what streams, check the engine after verl's update.

    The trainer's rollout adapter (``ServerAdapter.update_weights(weights, global_steps=None, **kwargs)`` in
    ``vllm_rollout.py``; 0.9.0 adds ``wire_format``) asks the server for
    ``collective_rpc("update_weights_from_ipc")``, streams the generator ``weights`` of ``(name, tensor)``
    through verl's ``BucketedWeightSender`` (CUDA IPC or shared memory) into the workers'
    ``model.load_weights``, then ``clear_kv_cache``.

    This runs on the rank that holds the server handle (verl's own condition, :func:`verifying_rank`:
    ``_has_server`` from 0.9.0, else ``rollout_rank == 0``): before the update it asks the engine to
    describe its parameters (once per adapter: shapes, dtypes, which slices of which trainer tensor each
    worker holds, :mod:`shim.verify.layout`); while verl streams, it digests each tensor as it passes (the
    slices every worker holds, in the engine's dtype, :mod:`shim.verify.digest`; only the digests are
    kept); after verl's update returned it asks the engine for the digests of the parameters the update
    touched and compares (``shim.verify.weights.report_stale``: one WARNING ``stale weights`` naming
    tensors, ``StaleWeights`` with ``SHIM_STRICT=1``, the counts ``verified`` / ``stale`` /
    ``unverifiable``). A LoRA adapter update (``peft_config`` with ``base_sync_done``: the tensors go to
    vLLM's LoRA manager, not the model) is compared with the adapter in that manager
    (``shim.verl.verify_adapter``).
    """
    from shim.verify import weights

    mode = weights.requested()
    stream = args[0] if args else kwargs.get("weights")  # the probe saw update_weights(self, weights, ...)
    if not mode or instance is None or stream is None or not verifying_rank(instance):
        return wrapped(*args, **kwargs)
    try:
        bound = call_args.signature(wrapped).bind(*args, **kwargs).arguments
        extra = bound.get("kwargs") or {}  # update_weights(..., **kwargs): what goes to update_weights_from_ipc
        adapter_only = bool(extra.get("peft_config") and extra.get("base_sync_done"))
        step = bound.get("global_steps")
        positional = bool(args)
        engine = _engines.setdefault(instance, Engine())
    except Exception as exc:  # never break verl's update
        log.warning(f"verify-weights ({SITE}): cannot read the call ({exc}); this update is not verified")
        return wrapped(*args, **kwargs)

    async def run():
        update = None
        try:
            if engine.disabled:
                unverifiable(engine, engine.disabled)
            elif adapter_only:  # to vLLM's LoRA manager, not the model's weights
                from shim.verl import verify_adapter

                update = verify_adapter.AdapterUpdate(extra.get("peft_config"))
            elif await _prepare(instance, engine):
                update = Update(engine, mode)
        except Exception as exc:  # the check must never stop training
            unverifiable(engine, f"the check failed ({type(exc).__name__}: {exc})")
        if update is None:
            return await wrapped(*args, **kwargs)
        watched = update.watch(stream)
        call = ((watched, *args[1:]), kwargs) if positional else (args, {**kwargs, "weights": watched})
        result = await wrapped(*call[0], **call[1])
        try:
            if adapter_only:
                from shim.verl import verify_adapter

                await verify_adapter.check(instance, engine, update, step)
            else:
                await _check(instance, engine, update, step)
        except weights.StaleWeights:
            raise
        except Exception as exc:  # the check must never stop training
            unverifiable(engine, f"the check failed ({type(exc).__name__}: {exc})")
        return result

    return run()
