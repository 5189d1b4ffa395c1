"""Start-up entry of ``python -m shim install``: the ``.pth`` line imports this
module and calls :func:`main`; Python 3.15+ calls ``shim._startup:main`` from the
PEP 829 ``.start`` file instead (and then skips the ``.pth`` import line). The children of such a
process run the same line, so no ``PYTHONPATH`` change is needed (``shim.activate(reach_children=False)``)."""


def main() -> None:
    import shim

    shim.activate(reach_children=False)  # every interpreter of the environment runs this line already
