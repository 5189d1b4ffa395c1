"""Every patch of the shim, in the order they are registered.

Importing this package imports only the patch modules, which import nothing of
torch, vLLM, TRL or ms-swift at module level.
"""
ALL = []
