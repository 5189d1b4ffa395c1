"""Contract of ``shim.patches.swift_resample_wake_order`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("swift_resample_wake_order")
