"""Contract of ``shim.patches.swift_gkd_teacher_zero3`` (generated: ``tests/support/contract.py``)."""
from tests.support.contract import contract_tests

test_contract, test_schema = contract_tests("swift_gkd_teacher_zero3")
