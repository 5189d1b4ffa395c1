"""Contract of ``shim.patches.verl_vlm_encoder_cache`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("verl_vlm_encoder_cache")
