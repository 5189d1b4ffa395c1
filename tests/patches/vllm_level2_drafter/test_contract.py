"""Contract of ``shim.patches.vllm_level2_drafter`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("vllm_level2_drafter")
