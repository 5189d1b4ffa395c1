"""Contract of ``shim.patches.trainer_metrics`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("trainer_metrics")
