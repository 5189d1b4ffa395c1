"""Contract of ``shim.patches.vllm_torch_cap`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("vllm_torch_cap")
