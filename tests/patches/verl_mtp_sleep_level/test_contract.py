"""Contract of ``shim.patches.verl_mtp_sleep_level`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("verl_mtp_sleep_level")
