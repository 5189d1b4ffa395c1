"""Overhead of a call through a shim wrapper against the bare call.

    python bench/call_overhead.py [--number 200000]

Wraps a method with the shim's ``Patcher.wrap`` (a pass-through wrapper, the
cheapest path every patch pays) and times bound calls with timeit. Goal: the
added cost under 5 microseconds per call.
"""
import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shim.engine.patcher import Patcher  # noqa: E402


class Engine:
    def generate(self, prompts, n=1):
        return prompts


class Wrapped(Engine):
    pass


def passthrough(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    number = parser.parse_args().number
    Patcher("bench").wrap(Wrapped, "generate", passthrough)
    bare, wrapped = Engine(), Wrapped()
    t_bare = min(timeit.repeat(lambda: bare.generate("p", n=2), number=number, repeat=5)) / number
    t_wrap = min(timeit.repeat(lambda: wrapped.generate("p", n=2), number=number, repeat=5)) / number
    print(f"bare call:     {t_bare * 1e6:6.3f} us")
    print(f"wrapped call:  {t_wrap * 1e6:6.3f} us")
    print(f"overhead:      {(t_wrap - t_bare) * 1e6:6.3f} us per call (goal < 5 us)")


if __name__ == "__main__":
    main()
