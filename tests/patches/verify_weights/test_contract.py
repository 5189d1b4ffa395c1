"""Contract of ``shim.patches.verify_weights`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("verify_weights")
