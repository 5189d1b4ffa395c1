"""Start-up time added by ``import shim.auto`` (what every interpreter pays after ``python -m shim install``).

    python bench/import_overhead.py [--runs 40]

Paired runs: each round starts ``python -c pass`` and ``python -c "import shim.auto"``
back to back (order alternating), each in a fresh interpreter of a bare venv of the base
Python (made in a temporary directory, no pip, nothing in its site-packages), ``PYTHONPATH``
= this checkout only, bytecode written in a warm-up (``PYTHONDONTWRITEBYTECODE`` unset: an
installed package has its ``.pyc``). Prints both medians and the median of the paired
differences. Goal: under 3 ms added.
Then ``-X importtime`` of one start: which modules ``import shim.auto`` loads.

A bare venv, not the base interpreter itself: the base's site-packages may hold ``.pth``
files that import ``typing``, ``re``, ``importlib.util`` at every start (certifi's, a
sandbox's), which hides exactly what the shim would add in a clean environment (2026-12-03:
2.5 ms on the base interpreter, 13 ms in a bare venv, for the same start-up that imported
``typing``). ``--python PATH`` measures that interpreter instead.
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time
import venv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = ""  # set by main()
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SHIM_"))}
ENV["PYTHONPATH"] = REPO


def once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([PYTHON, "-s", "-c", code], env=ENV, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--python", help="interpreter to measure (default: a bare venv of the base Python)")
    args = parser.parse_args()
    global PYTHON
    if args.python:
        PYTHON = args.python
        measure(args.runs)
        return
    with tempfile.TemporaryDirectory(prefix="shim-bench-venv-") as tmp:
        venv.create(tmp, with_pip=False, symlinks=os.name != "nt")
        PYTHON = os.path.join(tmp, "Scripts" if os.name == "nt" else "bin", "python")
        measure(args.runs)


def measure(runs: int) -> None:
    for _ in range(3):  # warm the file cache, write the .pyc files
        once("import shim.auto")
    bare, auto, diff = [], [], []
    for i in range(runs):
        if i % 2:
            a, b = once("import shim.auto"), once("pass")
        else:
            b, a = once("pass"), once("import shim.auto")
        bare.append(b)
        auto.append(a)
        diff.append(a - b)
    print(f"python: {PYTHON}")
    print(f"python -c pass:                {statistics.median(bare) * 1000:7.2f} ms (median of {runs})")
    print(f"python -c 'import shim.auto':  {statistics.median(auto) * 1000:7.2f} ms (median of {runs})")
    print(f"added by import shim.auto:     {statistics.median(diff) * 1000:7.2f} ms (median of {runs} paired differences; goal < 3 ms)")
    out = subprocess.run([PYTHON, "-s", "-X", "importtime", "-c", "import shim.auto"], env=ENV, capture_output=True,
                         text=True, check=True).stderr
    base = subprocess.run([PYTHON, "-s", "-X", "importtime", "-c", "pass"], env=ENV, capture_output=True,
                          text=True, check=True).stderr
    seen = {line.rsplit("|", 1)[-1].strip() for line in base.splitlines()}
    extra = [line.rsplit("|", 1)[-1].strip() for line in out.splitlines()
             if "|" in line and line.rsplit("|", 1)[-1].strip() not in seen and "import time" in line]
    print(f"modules imported by shim.auto beyond a bare start: {', '.join(m for m in extra if m != 'package')}")


if __name__ == "__main__":
    main()
