"""Installed versions (from metadata, never by importing) and range checks."""
from __future__ import annotations


def installed(distribution: str) -> str | None:
    """Version of an installed distribution, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def in_range(version: str, spec: str) -> bool:
    """True when ``version`` is inside ``spec``; dev, rc and local builds count.

    ``0.10.2.dev45+g1a2b`` is in ``>=0.10,<0.11``: nightly and vendor builds are
    what people run. An unparseable version is never in range.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(spec).contains(parsed, prereleases=True)


_installed_in: dict = {}


def installed_in(distribution: str, spec: str) -> bool:
    """Whether the installed ``distribution`` is in ``spec`` (False when it is not installed); read once per
    process and pair, for the wrappers that branch on it at every call."""
    key = (distribution, spec)
    if key not in _installed_in:
        version = installed(distribution)
        _installed_in[key] = bool(version) and in_range(version, spec)
    return _installed_in[key]
