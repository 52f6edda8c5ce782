"""Helpers of the data tests: data files written as their formats encode them, and the settings
of their Hypothesis tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hypothesis import HealthCheck, settings

LATIN_1_FILES = (".item", ".dat", ".genre")
"""MovieLens's files (``u.item``, ``u.genre``, ``*.dat``) are Latin-1; every other format is UTF-8."""


def encoded(name: str, content: str | bytes) -> bytes:
    """``content`` as the file ``name`` stores it: text in its format's encoding, bytes as given."""
    if isinstance(content, bytes):
        return content
    return content.encode("latin-1" if name.endswith(LATIN_1_FILES) else "utf-8")


def write_files(folder: Path, files: Mapping[str, str | bytes]) -> Path:
    """Writes ``files`` (name -> content, :func:`encoded`) into ``folder``, made if missing.

    Returns:
        ``folder``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(encoded(name, content))
    return folder


def reproducible(max_examples: int) -> settings:
    """Hypothesis settings drawing the same ``max_examples`` files every run (nothing stored
    between runs), with no deadline and no health check on slow draws: a loaded machine must
    not fail a test that reads files."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
