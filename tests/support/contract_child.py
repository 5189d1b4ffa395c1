"""The cases of the patch contract, each in a fresh process (``tests/support/contract.py`` starts it).

    python contract_child.py OUT_DIR [--megatron] [--swift] [--trl] [--bare] PATCH_ID:CASE ...

``CONTRACT_CASE_ENV`` (JSON ``{patch id: {var: value}}``): set in that patch's case forks.

The interpreter imports the heavy third-party libraries the upstream module needs (torch,
transformers; never the patched distribution, the shim or the upstream module itself), then
FORKS one process per case: each case starts from that state with no shim imported, runs, and
writes one JSON file ``OUT_DIR/<PATCH_ID>:<CASE>.json`` (the decision and what the patch left on
the upstream objects) or ``....err`` with the traceback. Cases:

- ``before``: activate, then import the upstream module, activate again and fire the hook
  again: applied once, each changed attribute carries exactly one wrapper of this patch.
- ``after``: import, then activate: applied; a second (foreign) wrapper put on top of each
  changed attribute; ``remove`` takes out only this patch's layer (the other one stays and
  still reaches the original); undoing the other one leaves exactly the original objects.
- ``out_of_range``: the installed version reported as 0.0.1: stands down, nothing changed.
- ``shape``: every attribute the patch changes is deleted from upstream first (one it adds: the class
  that would hold it): stands down (the probe sees it), nothing changed.
- ``apply_raises``: ``apply`` raises after it made its changes: decision ``failed``, every
  change rolled back to the identical objects, the user's import goes on.
"""
import json
import sys


def run_case(pid, case):
    import importlib

    from shim.engine import catalog, registry, versions
    from shim.engine.patcher import MISSING, Patcher, markers

    entry = next(e for e in catalog.entries() if e.id == pid)
    patch = entry.load()
    out = {"case": case}

    def owned(owner, name):
        return vars(owner).get(name, MISSING)

    def describe(changes):
        return [{"owner": getattr(o, "__qualname__", getattr(o, "__name__", repr(o))), "name": n,
                 "markers": markers(getattr(o, n, None))} for o, n, _ in changes]

    if case == "before":
        registry.activate([entry])
        module = importlib.import_module(entry.module)
        out["again"] = registry.activate([entry])
        registry._on_import(entry, module)
        out["decision"] = registry.decisions()[pid].decision
        out["changes"] = describe(registry.changes(pid))
    elif case == "after":
        module = importlib.import_module(entry.module)
        registry.activate([entry])
        out["decision"] = registry.decisions()[pid].decision
        changes = registry.changes(pid)
        out["changes"] = describe(changes)
        other = Patcher("contract-other")
        for owner, name, _ in changes:
            if callable(getattr(owner, name)):
                other.wrap(owner, name, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
        out["removed"] = registry.remove(pid)
        out["after_remove"] = describe(changes)
        out["other_reaches_original"] = all(owned(o, n).__wrapped__ is before for o, n, before in changes
                                            if before is not MISSING
                                            and markers(owned(o, n)) == ["contract-other"])
        other.undo()
        out["exact"] = all(owned(o, n) is before for o, n, before in changes)
        out["status"] = registry.decisions()[pid].text()
    elif case == "out_of_range":
        versions.installed = lambda distribution: "0.0.1"
        registry.activate([entry])
        importlib.import_module(entry.module)
        d = registry.decisions()[pid]
        out["decision"], out["reason"] = d.decision, d.reason
        out["changes"] = describe(registry.changes(pid))
    elif case == "shape":
        module = importlib.import_module(entry.module)
        probe = Patcher(pid)
        patch.apply(module, probe)  # learn what it changes, then undo and take those names away
        changed = [(o, n) for o, n, _ in probe.changes]
        probe.undo()
        out["deleted"] = []
        for owner, name in dict.fromkeys(changed):
            if name in vars(owner):
                delattr(owner, name)
                out["deleted"].append(f"{getattr(owner, '__name__', owner)}.{name}")
            elif not hasattr(owner, name):  # an attribute the patch adds (none upstream): its owner goes instead
                for key, value in list(vars(module).items()):
                    if value is owner:
                        delattr(module, key)
                        out["deleted"].append(f"{module.__name__}.{key}")
        registry.activate([entry])
        d = registry.decisions()[pid]
        out["decision"], out["reason"] = d.decision, d.reason
        out["changes"] = describe(registry.changes(pid))
    elif case == "apply_raises":
        seen = []
        original = patch.apply

        def failing(module, patcher):
            original(module, patcher)
            seen.extend(patcher.changes)
            raise RuntimeError("contract: apply fails after its changes")

        patch.apply = failing
        registry.activate([entry])
        importlib.import_module(entry.module)
        d = registry.decisions()[pid]
        out["decision"], out["reason"] = d.decision, d.reason
        out["made"] = len(seen)
        out["exact"] = all(owned(o, n) is before for o, n, before in seen)
        out["markers_left"] = [m for o, n, _ in seen for m in markers(getattr(o, n, None))]
    return out


PRELOAD = ("torch", "transformers")
SWIFT_PRELOAD = ("accelerate", "datasets", "peft", "trl")
"""ms-swift's dependencies (``--swift``): never the patched distribution or its modules; trl's root
is a lazy module, so none of the TRL modules other patches hook is imported by it."""
TRL_PRELOAD = ("accelerate", "datasets", "peft", "transformers.trainer")
"""TRL's dependencies (``--trl``), what each trainer module's import spends most of its time on; no
TRL-kind record hooks them (``trainer-metrics`` hooks ``transformers.trainer`` and is tested on the
stand-in alone). A missing one is skipped (a release that does not need it)."""


def main():
    import importlib

    out_dir, args = sys.argv[1], sys.argv[2:]
    if "--megatron" in args:
        args.remove("--megatron")
        from tests.support import mcore_bridge

        mcore_bridge.install()
    preload, optional = PRELOAD, ()
    if "--swift" in args:
        args.remove("--swift")
        preload += SWIFT_PRELOAD
    if "--trl" in args:
        args.remove("--trl")
        optional = TRL_PRELOAD
    if "--bare" in args:  # a record whose upstream needs neither torch nor transformers (Ray's)
        args.remove("--bare")
        preload = ()
    for name in preload:  # the expensive part, paid once; nothing of the shim or the patched code
        importlib.import_module(name)
    for name in optional:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    assert not any(m == "shim" or m.startswith("shim.") for m in sys.modules)
    # Cases that activate first fork from this state; the ones that import the upstream module first
    # (``after``, ``shape``) then fork from a parent that imported the batch's upstream modules once
    # (their own import is what they would repeat: seconds per case for ms-swift's). Only the shim
    # stays out of the parent: each case activates its one patch in its own fork.
    cold = [a for a in args if a.split(":")[1] not in WARM]
    warm = [a for a in args if a.split(":")[1] in WARM]
    for arg in cold:
        _fork_case(out_dir, arg)
    if warm:
        _import_upstream([a.split(":")[0] for a in warm])
        assert not any(m == "shim" or m.startswith("shim.") for m in sys.modules)
    for arg in warm:
        _fork_case(out_dir, arg)


WARM = ("after", "shape")
"""Cases that import the upstream module before they activate the shim."""


def _import_upstream(pids) -> None:
    """The upstream modules the patches ``pids`` hook, read from ``patches/__init__.py``'s INDEX
    without importing the shim (it stays out of the parent)."""
    import importlib
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "_contract_index", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                        "patches", "__init__.py"))
    index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(index)
    modules = {row[0]: row[2] for row in index.INDEX}
    for pid in dict.fromkeys(pids):
        try:
            importlib.import_module(modules[pid])
        except Exception:  # the case itself imports it again and reports what fails
            pass


def _fork_case(out_dir, arg) -> None:
    """Run one ``PATCH_ID:CASE`` in a forked child of this process; wait for it."""
    import os
    import traceback

    pid, case = arg.split(":")
    pid_ = os.fork()
    if pid_ == 0:
        code = 0
        try:
            os.environ.update(json.loads(os.environ.get("CONTRACT_CASE_ENV") or "{}").get(pid, {}))
            result = run_case(pid, case)
            with open(os.path.join(out_dir, f"{arg}.json"), "w") as f:
                json.dump(result, f)
        except BaseException:
            code = 1
            with open(os.path.join(out_dir, f"{arg}.err"), "w") as f:
                f.write(traceback.format_exc())
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.waitpid(pid_, 0)

if __name__ == "__main__":
    main()
