"""Which patches exist, and their records, loaded only when needed.

The engine (``shim.engine.registry``) never imports the patches; this module reads the
table ``shim.patches.INDEX`` (ids and hooked module names, no imports) and
imports a patch module only when its upstream module is imported, or when a
command needs every record (``status``). Installed, the repository's
``patches/`` folder is the package ``shim.patches`` (setuptools ``package-dir``,
editable installs included); run from a source checkout without an install
(``PYTHONPATH=<repo>``), the same folder is loaded under that name here.
"""
from __future__ import annotations

import os
import sys

PACKAGE = "shim.patches"


def _package():
    """``shim.patches``: the folder beside this ``shim`` package in a checkout, inside it when installed.

    Chosen by where THIS ``shim`` was imported from, never by a finder elsewhere on the path, so a
    checkout on ``PYTHONPATH`` (or an editable install) always pairs its own ``shim/`` with its own
    ``patches/``."""
    module = sys.modules.get(PACKAGE)
    if module is not None:
        return module
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # shim/
    checkout = os.path.join(os.path.dirname(here), "patches")
    if os.path.isdir(os.path.join(here, "patches")) or not os.path.isfile(os.path.join(checkout, "__init__.py")):
        __import__(PACKAGE)  # not importlib.import_module: ``importlib`` imports ``warnings`` at start-up
        return sys.modules[PACKAGE]
    # importlib.util's two functions, from the import system's own modules (always loaded):
    # ``import importlib.util`` costs ~3 ms at start-up (contextlib, collections, functools, ...).
    try:
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import spec_from_file_location
    except ImportError:  # not CPython
        from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location(PACKAGE, os.path.join(checkout, "__init__.py"), submodule_search_locations=[checkout])
    module = module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    import shim

    shim.patches = module
    return module


def index() -> tuple:
    """``(site id, patch module, upstream module, bug id)`` rows in registration order."""
    return _package().INDEX


def ids() -> list:
    return [row[0] for row in index()]


def bugs() -> dict:
    """Bug id -> its site ids, in registration order (from INDEX: nothing imported)."""
    out: dict = {}
    for row in index():
        out.setdefault(row[3], []).append(row[0])
    return out


def bug_of(site_id: str) -> str:
    for row in index():
        if row[0] == site_id:
            return row[3]
    raise LookupError(site_id)


def bug_records() -> dict:
    """Bug id -> its ``patches.bugs.Bug`` row (reference, problem, when, needs); imports that table only."""
    return {bug.id: bug for bug in patch_module("bugs").BUGS}


def removed() -> dict:
    """Ids of deleted patches (id -> why); still accepted in a disable list."""
    return dict(_package().REMOVED)


def patch_module(name: str):
    """Patch module ``name`` of ``shim.patches`` (imports it)."""
    import importlib

    _package()
    return importlib.import_module(f"{PACKAGE}.{name}")


def load_module(name: str) -> list:
    """The ``PATCHES`` list of patch module ``name`` (imports it)."""
    return list(patch_module(name).PATCHES)


def all_patches() -> list:
    """Every ``Patch`` record in registration order (imports every patch module)."""
    by_id = {}
    for module in dict.fromkeys(row[1] for row in index()):
        for patch in load_module(module):
            by_id[patch.id] = patch
    return [by_id[i] for i in ids() if i in by_id]


def load_patch(patch_id: str, module: str):
    """The ``Patch`` record ``patch_id`` of patch module ``module``."""
    for patch in load_module(module):
        if patch.id == patch_id:
            return patch
    raise LookupError(f"{PACKAGE}.{module} exports no patch {patch_id!r}")


def entries() -> list:
    """One ``shim.engine.patch.Entry`` per INDEX row: id and hooked module now, the record on first use."""
    from shim.engine.patch import Entry

    return [Entry(pid, target, lambda pid=pid, module=module: load_patch(pid, module), bug)
            for pid, module, target, bug in index()]
