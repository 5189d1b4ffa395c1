"""Contract of ``shim.patches.vllm_prefix_reset_check`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("vllm_prefix_reset_check")
