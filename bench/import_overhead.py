"""Added start-up time of ``import shim.auto``: median over repeated interpreter starts.

    python bench/import_overhead.py [--runs 30]

Prints the median wall time of ``python -c pass`` and of
``python -c "import shim.auto"`` (each in a fresh interpreter), and the
difference. Goal: under 20 ms.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_seconds(code: str, runs: int) -> float:
    env = dict(os.environ, PYTHONPATH=REPO)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    median_seconds("import shim.auto", 3)  # warm the file cache
    bare = median_seconds("pass", runs)
    auto = median_seconds("import shim.auto", runs)
    print(f"python -c pass:              {bare * 1000:7.1f} ms (median of {runs})")
    print(f"python -c 'import shim.auto': {auto * 1000:7.1f} ms (median of {runs})")
    print(f"added by import shim.auto:   {(auto - bare) * 1000:7.1f} ms (goal < 20 ms)")


if __name__ == "__main__":
    main()
