"""Contract of ``shim.patches.trl_lora_merge_drift`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("trl_lora_merge_drift")
