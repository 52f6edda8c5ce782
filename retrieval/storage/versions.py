"""Versions of a deployment root: ``versions/<name>`` folders and the ``current`` link that
readers follow, switched atomically, by one writer at a time (:func:`writer_lock`)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from retrieval.storage.folders import fsync_tree
from retrieval.storage.manifest import MANIFEST, ArtifactError

logger = logging.getLogger(__name__)

CURRENT = "current"
VERSIONS = "versions"
LOCK = ".lock"
"""The file of a root that its writers lock (``flock``), one at a time."""

_held = threading.local()
"""The roots whose lock this thread holds (``roots``: a set of real paths)."""

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
        ROOT/.lock     locked by the writer publishing (:func:`writer_lock`)

    The whole step holds the root's writer lock (:func:`writer_lock`; a caller that read
    ``current`` to derive the new version holds it already, from before that read), so writers
    publish one after another, each over the version before. The ``keep`` newest versions stay
    on disk, and older ones only go once they have not been current for ``grace`` seconds (a
    reader still loading one is not pulled from under); leftovers of crashed writes go after
    ``grace`` too.

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
    root.mkdir(parents=True, exist_ok=True)
    with writer_lock(root):
        versions = root / VERSIONS
        versions.mkdir(exist_ok=True)
        now = time.time_ns()  # one reading: seconds and fraction from two could straddle a second
        name = (
            time.strftime("%Y%m%dT%H%M%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z-{os.getpid()}"
        )
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
        _retire(root, previous, keep, grace)
    return versions / name


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Holds the exclusive lock of the existing folder ``root`` (``flock`` on ``root/.lock``,
    created if missing) for the block: every writer of a root (:func:`publish`, and a catalogue
    change from the moment it reads ``current``) holds it, so none publishes over a version it
    did not read. A writer that has to wait logs one WARNING saying so. The lock goes with its
    process (a killed writer leaves none behind) and is re-entrant within a thread.

    ``flock`` locks are per host: writers of a root on a network file system must run on one
    machine.

    Raises:
        OSError: the lock file cannot be opened (``root`` missing, no permission).
    """
    root = Path(root)
    key = os.path.realpath(root)
    held: set[str] = _held.__dict__.setdefault("roots", set())
    if key in held:  # this thread holds it: publish inside a catalogue change
        yield
        return
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            logger.warning(
                "waiting for another writer of %s%s to finish",
                root,
                f" (process {holder})" if holder.isdigit() else "",
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # names the holder to whoever waits
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
    finally:
        os.close(fd)  # releases the lock


def _retire(root: Path, previous: Path | None, keep: int, grace: float) -> None:
    """After ``current`` switched from ``previous``: marks when ``previous`` stopped being
    current (its mtime) and removes the versions past the ``keep`` newest and the leftovers of
    crashed writes that have not been current for ``grace`` seconds. The new version is
    published already, so nothing here fails the publication: an entry that vanished is
    skipped, and any other error is logged."""
    versions = root / VERSIONS
    try:
        if previous is not None and previous.is_dir():
            os.utime(previous)
        retired = time.time() - grace
        complete = version_folders(root)
        leftovers = [p for p in versions.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError as e:
        logger.warning("published; old versions of %s not pruned: %s", root, e)
        return
    for old in [*complete[:-keep], *leftovers]:
        try:
            if old.stat().st_mtime < retired:
                shutil.rmtree(old)
        except FileNotFoundError:
            continue  # gone already
        except OSError as e:
            logger.warning("published; could not remove the old version %s: %s", old, e)


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
