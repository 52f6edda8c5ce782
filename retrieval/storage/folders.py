"""Folders written atomically: a crash never leaves half an artifact where a reader would look.

Every artifact (a trained model, an index) is a folder holding its files and a
``manifest.json`` (:mod:`retrieval.storage.manifest`). :func:`write_artifact` builds it under a
temporary name beside the destination and renames it into place; the temporary names carry
the writer's process id and host, so :func:`remove_stale_temporaries` can tell what a crashed
writer left behind from what a live one is still writing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from retrieval.storage.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    ArtifactError,
    contained_file,
    derived_version,
    file_checksums,
    sha256_file,
)

_TEMPORARY = re.compile(r"^\..+\.(?:tmp|old)-(?P<pid>\d+)@(?P<host>[A-Za-z0-9._]+)-[^-]+$")
"""Names of the folders :func:`write_artifact` works in (``.<name>.tmp-<pid>@<host>-<random>``),
so that those of a writer that died (``kill -9``, power loss) can be recognised and removed."""

_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_RENAME_EXCHANGE = 2  # linux/fs.h


@contextlib.contextmanager
def write_artifact(out: Path, kind: str, meta: dict[str, Any], overwrite: bool = False) -> Iterator[Path]:
    """Context manager yielding a temporary folder to fill; on success it becomes ``out``.

    The manifest (kind, metadata, checksums, creation time, version) is written last.
    The version is ``meta["version"]`` when given, otherwise derived from the checksums.
    On any exception the temporary folder is removed and ``out`` is left untouched; an
    ``OSError`` while writing (disk full, no permission) becomes an :class:`ArtifactError` that
    says so. An existing ``out`` (``overwrite``) is swapped for the new folder in one atomic
    ``renameat2(RENAME_EXCHANGE)`` where the file system supports it, so a crash at any point
    leaves ``out`` naming the old or the new artifact, whole. Temporary folders left beside
    ``out`` by writers that were killed are removed first.

    Example:
        >>> with write_artifact(Path("runs/idx"), "index", {"dim": 16}) as tmp:
        ...     (tmp / "index.faiss").write_bytes(data)

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        ArtifactError: the artifact could not be written (the cause is chained).
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}@{_HOST}-", dir=out.parent))
    try:
        yield tmp
        checksums = file_checksums(tmp)
        version = meta.get("version") or derived_version(checksums)
        manifest = {
            "kind": kind,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            **meta,
            "version": version,
            "files": checksums,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        fsync_tree(tmp)
        _move_into_place(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        where = f" ({e.filename})" if e.filename else ""
        raise ArtifactError(
            f"could not write the {kind} artifact {out}: {e.strerror or e}{where}; "
            f"{'the previous one is unchanged' if out.exists() else 'nothing was written'}"
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, out: Path) -> None:
    """Renames the complete folder ``tmp`` to ``out``, atomically replacing an existing ``out``."""
    if not out.exists():
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old artifact
    else:
        # No atomic exchange here: move the old folder aside, the new one in, and put the old
        # one back if that fails; only a crash between the two renames leaves ``out`` missing.
        old = out.with_name(f".{out.name}.old-{os.getpid()}@{_HOST}-{os.urandom(4).hex()}")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(out.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two paths (Linux ``renameat2``); False where that is not supported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(error, os.strerror(error), str(b))


def _fsync_dir(folder: Path) -> None:
    """Makes a rename in ``folder`` durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_folder(path: Path) -> None:
    """Deletes a folder so that it is never seen half-deleted under its name: it is renamed to
    a hidden temporary name first (removed by :func:`remove_stale_temporaries` if the deletion
    is cut short). A missing folder is fine."""
    path = Path(path)
    hidden = path.with_name(f".{path.name}.old-{os.getpid()}@{_HOST}-{os.urandom(4).hex()}")
    try:
        os.rename(path, hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Removes the temporary folders of :func:`write_artifact` calls on this host whose process
    has died (killed mid-write); those of live processes and anything else stay.

    Returns:
        The folders removed.
    """
    removed = []
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            match = _TEMPORARY.match(entry.name)
            if not match or match["host"] != _HOST or entry.is_symlink() or not entry.is_dir():
                continue
            if _process_alive(int(match["pid"])):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: alive
        return True
    return True


def fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-links a file (artifacts are never modified in place), copying across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def derive_folder(
    src: Path,
    manifest: Mapping[str, Any],
    dst: Path,
    write: Callable[[Path], Iterable[str]],
    updates: Mapping[str, Any],
) -> dict[str, Any]:
    """Writes the new folder ``dst``: the artifact ``src`` (whose manifest is ``manifest``) with
    the files ``write(dst)`` writes (it returns their names) and every other listed file
    hard-linked, keeping the checksum ``manifest`` lists for it, so that nothing unchanged is
    read again. The new manifest is ``manifest`` with ``updates``, the new checksums and a
    version derived from them. ``dst`` is not written atomically: write it inside a folder that
    is (:func:`write_artifact`, :func:`retrieval.storage.versions.publish`).

    Returns:
        The new manifest.
    """
    dst.mkdir()
    written = set(write(dst))
    files = dict(manifest["files"])
    for name in sorted(set(files) - written):
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(contained_file(src, name), dst / name)
    files.update({name: sha256_file(dst / name) for name in written})
    new = {
        **manifest,
        **updates,
        "files": files,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "version": derived_version(files),
    }
    (dst / MANIFEST).write_text(json.dumps(new, indent=2, sort_keys=True))
    return new
