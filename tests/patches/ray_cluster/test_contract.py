"""Contract of ``shim.patches.ray_cluster`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("ray_cluster")
