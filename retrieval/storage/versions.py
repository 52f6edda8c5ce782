"""Versions of a deployment root: ``versions/<name>`` folders and the ``current`` link that
readers follow, switched atomically."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from retrieval.storage.folders import fsync_tree
from retrieval.storage.manifest import MANIFEST, ArtifactError

CURRENT = "current"
VERSIONS = "versions"

PUBLISH_GRACE = 60.0
"""Seconds a version stays on disk after it stopped being current, whatever ``keep`` says: a
reader that resolved it just before a swap can finish loading it."""


def publish(root: Path, write: Callable[[Path], object], keep: int = 3, grace: float = PUBLISH_GRACE) -> Path:
    """Writes a new version under ``root`` and atomically makes it the current one.

    ``write(folder)`` creates the version's folder (it does not exist yet) under a temporary
    name, renamed into ``versions/`` once complete. Only then is the ``root/current`` symlink
    replaced, by a single ``rename``, so a reader resolving ``root`` (:func:`resolve_current`)
    gets the old or the new version, never a half-written one::

        ROOT/current -> versions/20261130T221500.123456789Z-4242
        ROOT/versions/<one folder per version>

    The ``keep`` newest versions stay on disk, and older ones only go once they have not been
    current for ``grace`` seconds (a reader still loading one is not pulled from under);
    leftovers of crashed writes go after ``grace`` too.

    Returns:
        The new version folder.

    Raises:
        ArtifactError: ``root`` is itself an artifact folder.
        ValueError: ``keep`` below 1 or a negative ``grace``.
    """
    if keep < 1 or grace < 0:
        raise ValueError(f"need keep >= 1 and grace >= 0, got {keep} and {grace}")
    root = Path(root)
    if (root / MANIFEST).exists():
        raise ArtifactError(f"{root} is a plain artifact folder: publish into a new root folder")
    versions = root / VERSIONS
    versions.mkdir(parents=True, exist_ok=True)
    now = time.time_ns()  # one reading: seconds and fraction from two could straddle a second
    name = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z-{os.getpid()}"
    staging = versions / f".{name}.tmp"
    try:
        write(staging)
        fsync_tree(staging)
        os.rename(staging, versions / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = resolve_current(root) if (root / CURRENT).is_symlink() else None
    link = root / f".{CURRENT}.tmp-{os.getpid()}"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(Path(VERSIONS) / name, link)
    os.replace(link, root / CURRENT)  # atomic: readers follow either the old or the new link
    if previous is not None and previous.is_dir():
        os.utime(previous)  # its mtime now says when it stopped being current
    retired = time.time() - grace
    complete = version_folders(root)
    leftovers = [p for p in versions.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    for old in [*complete[:-keep], *leftovers]:
        if old.stat().st_mtime < retired:
            shutil.rmtree(old, ignore_errors=True)
    return versions / name


def version_folders(root: Path) -> list[Path]:
    """The complete version folders of ``root``, oldest first (their names start with the time
    they were published); none when it has no ``versions/``."""
    versions = Path(root) / VERSIONS
    if not versions.is_dir():
        return []
    return sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith("."))


def resolve_current(path: Path) -> Path:
    """The folder ``path`` names: itself, or the version ``path/current`` points to (resolved
    once, so every file is then read from that one version)."""
    path = Path(path)
    current = path / CURRENT
    if not (path / MANIFEST).exists() and (current.is_symlink() or current.is_dir()):
        return current.resolve()
    return path
