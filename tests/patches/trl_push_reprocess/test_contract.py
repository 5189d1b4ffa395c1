"""Contract of ``shim.patches.trl_push_reprocess`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("trl_push_reprocess")
