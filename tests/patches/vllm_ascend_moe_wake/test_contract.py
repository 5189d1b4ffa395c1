"""Contract of ``shim.patches.vllm_ascend_moe_wake`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("vllm_ascend_moe_wake")
