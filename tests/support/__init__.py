"""Support code shared by the generated per-patch tests (``tests/patches``)."""
