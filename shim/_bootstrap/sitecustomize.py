"""Bootstrap put first on PYTHONPATH by ``python -m shim COMMAND``.

It activates the shim in every Python process COMMAND starts (torchrun ranks,
spawned vLLM workers, grandchildren), then runs the user's own
``sitecustomize`` -- the next one on ``sys.path`` -- as ddtrace's bootstrap
does. It never lets an exception out and never adds the current directory to
the path.
"""


def _activate() -> None:
    import os
    import sys

    try:
        shim = sys.modules.get("shim") or _own_shim(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except Exception as exc:
        print(f"[shim] ERROR bootstrap cannot import shim ({type(exc).__name__}: {exc}); shim not activated",
              file=sys.stderr)
        return
    try:
        shim.activate()
    except Exception as exc:  # activate() raises only under SHIM_STRICT=1: the user asked for it
        if os.environ.get("SHIM_STRICT", "").strip().lower() in ("1", "true", "yes", "on"):
            raise
        print(f"[shim] ERROR activation failed: {exc!r}", file=sys.stderr)


def _own_shim(package_dir: str):
    """The ``shim`` package this bootstrap belongs to (its parent directory), whatever else is
    named ``shim`` on ``sys.path``: a user's ``shim.py`` must not take its place."""
    import importlib.util
    import os
    import sys

    spec = importlib.util.spec_from_file_location("shim", os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules["shim"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["shim"]
        raise
    return module


def _chain() -> None:
    """Load the next ``sitecustomize`` on sys.path, skipping this directory."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # what site.py itself does with a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


_activate()
_chain()
