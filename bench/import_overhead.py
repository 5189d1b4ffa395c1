"""Start-up time added by ``import shim.auto`` (what every interpreter pays after ``python -m shim install``).

    python bench/import_overhead.py [--runs 40]

Paired runs: each round starts ``python -c pass`` and ``python -c "import shim.auto"``
back to back (order alternating), each in a fresh interpreter of the base Python (no
venv site-packages), ``PYTHONPATH`` = this checkout only, bytecode written in a warm-up
(``PYTHONDONTWRITEBYTECODE`` unset: an installed package has its ``.pyc``). Prints both
medians and the median of the paired differences. Goal: under 3 ms added.
Then ``-X importtime`` of one start: which modules ``import shim.auto`` loads.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = getattr(sys, "_base_executable", sys.executable)
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SHIM_"))}
ENV["PYTHONPATH"] = REPO


def once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([PYTHON, "-s", "-c", code], env=ENV, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    runs = parser.parse_args().runs
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
