"""A pytest file for tests/unit/test_suite_tools.py (copied there as ``test_grouped.py``): six tests of one
``xdist_group``, each writing the name of the worker that ran it next to itself."""
import os
import time

import pytest


@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("k", range(6))
def test_member(k):
    time.sleep(0.2)
    with open(os.path.join(os.path.dirname(__file__), f"w{k}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
