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
        import shim
    except ImportError:  # running from a source tree: the package is two levels up
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        try:
            import shim
        except ImportError as exc:
            print(f"[shim] ERROR bootstrap cannot import shim ({exc}); shim not activated", file=sys.stderr)
            return
    try:
        shim.activate()
    except Exception as exc:  # activate() does not raise; belt and braces for the user's start-up
        print(f"[shim] ERROR activation failed: {exc!r}", file=sys.stderr)


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
