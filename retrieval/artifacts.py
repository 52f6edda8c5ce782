"""Self-describing artifact folders, written atomically and verified on load.

Every artifact (a trained model, an index) is a folder holding its files and a
``manifest.json`` with its kind, version, metadata and the SHA-256 of every file.
Folders are written under a temporary name beside the destination and renamed into
place, so a crash never leaves half an artifact where a reader would pick it up.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
CURRENT = "current"
VERSIONS = "versions"


class ArtifactError(RuntimeError):
    """An artifact folder is missing, incomplete, corrupted or of the wrong kind."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checksums(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


_TEMPORARY = re.compile(r"^\..+\.(?:tmp|old)-(?P<pid>\d+)@(?P<host>[A-Za-z0-9._]+)-[^-]+$")
"""Names of the folders :func:`write_artifact` works in (``.<name>.tmp-<pid>@<host>-<random>``),
so that those of a writer that died (``kill -9``, power loss) can be recognised and removed."""
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_SHA256 = re.compile(r"[0-9a-f]{64}")
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
        checksums = _checksums(tmp)
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
        _fsync_tree(tmp)
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


def derived_version(checksums: dict[str, str]) -> str:
    """The version of an artifact written without one: a digest of its files' checksums."""
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()[:16]


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


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def read_manifest(path: Path, kind: str, verify: bool = True) -> dict[str, Any]:
    """Loads ``path/manifest.json``, checks its structure and kind and (by default) every file's
    checksum.

    Every listed path must be a relative path inside the folder: absolute paths, ``..``
    components and symlinks that lead outside are refused before anything is read.

    Raises:
        ArtifactError: the folder or manifest is missing, not a JSON object, of another kind or
            format version, without a version, lists a path outside the folder, or a file is
            missing or does not match its checksum.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{path} is not a {kind} artifact: {MANIFEST} not found")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ArtifactError(f"{manifest_path} is not valid JSON: {e}") from e
    except OSError as e:
        raise ArtifactError(f"{manifest_path} cannot be read: {e.strerror or e}") from e
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{manifest_path} is not a JSON object")
    if manifest.get("kind") != kind:
        raise ArtifactError(f"{path} holds a {manifest.get('kind')!r} artifact, expected {kind!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{manifest_path} has format version {manifest.get('format_version')!r}; "
            f"this code reads version {FORMAT_VERSION}"
        )
    if not isinstance(manifest.get("version"), str) or not manifest["version"]:
        raise ArtifactError(f"{manifest_path} has no version")
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        raise ArtifactError(f"{manifest_path}: 'files' must map file names to SHA-256 checksums")
    root = path.resolve()
    for name, expected in files.items():
        if not isinstance(expected, str) or not _SHA256.fullmatch(expected):
            raise ArtifactError(f"{manifest_path}: the checksum of {name!r} is not a SHA-256 hex digest")
        file = contained_file(path, name, root)
        if not file.is_file():
            raise ArtifactError(f"{path} is incomplete: {name} is missing")
        if verify and sha256_file(file) != expected:
            raise ArtifactError(f"{path / name} is corrupted: checksum does not match the manifest")
    return manifest


def contained_file(path: Path, name: str, root: Path | None = None) -> Path:
    """``path / name`` resolved, refused unless it is inside ``path``.

    ``name`` must be a relative POSIX path without ``..`` (nor empty, nor ``.``, nor
    backslashes); after resolving symlinks the file must still be inside ``path``.

    Raises:
        ArtifactError: ``name`` would leave the artifact folder.
    """
    parts = name.split("/") if isinstance(name, str) else []
    if (
        not parts
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ArtifactError(
            f"{Path(path) / MANIFEST} lists {name!r}, which is not a path inside the artifact"
        )
    root = Path(path).resolve() if root is None else root
    file = (Path(path) / name).resolve()
    if root not in file.parents:
        raise ArtifactError(f"{Path(path) / MANIFEST} lists {name!r}, which is outside the artifact")
    return file


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
    name = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z-{os.getpid()}"
    staging = versions / f".{name}.tmp"
    try:
        write(staging)
        _fsync_tree(staging)
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
    complete = sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith("."))
    leftovers = [p for p in versions.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    for old in [*complete[:-keep], *leftovers]:
        if old.stat().st_mtime < retired:
            shutil.rmtree(old, ignore_errors=True)
    return versions / name


def resolve_current(path: Path) -> Path:
    """The folder ``path`` names: itself, or the version ``path/current`` points to (resolved
    once, so every file is then read from that one version)."""
    path = Path(path)
    current = path / CURRENT
    if not (path / MANIFEST).exists() and (current.is_symlink() or current.is_dir()):
        return current.resolve()
    return path
