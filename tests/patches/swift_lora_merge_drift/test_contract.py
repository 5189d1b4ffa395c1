"""Contract of ``shim.patches.swift_lora_merge_drift`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("swift_lora_merge_drift")
