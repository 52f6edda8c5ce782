"""Self-describing artifact folders, written atomically and verified on load.

Every artifact (a trained model, an index) is a folder holding its files and a
``manifest.json`` with its kind, version, metadata and the SHA-256 of every file.
Folders are written under a temporary name beside the destination and renamed into
place, so a crash never leaves half an artifact where a reader would pick it up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
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


@contextlib.contextmanager
def write_artifact(out: Path, kind: str, meta: dict[str, Any], overwrite: bool = False) -> Iterator[Path]:
    """Context manager yielding a temporary folder to fill; on success it becomes ``out``.

    The manifest (kind, metadata, checksums, creation time, version) is written last.
    The version is ``meta["version"]`` when given, otherwise derived from the checksums.
    On any exception the temporary folder is removed and ``out`` is left untouched.

    Example:
        >>> with write_artifact(Path("runs/idx"), "index", {"dim": 16}) as tmp:
        ...     (tmp / "index.faiss").write_bytes(data)
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        checksums = _checksums(tmp)
        version = (
            meta.get("version")
            or hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()[:16]
        )
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
        if out.exists():
            # Move the old folder aside first so ``out`` always names a complete artifact
            # or nothing; the old copy is removed only once the new one is in place.
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def read_manifest(path: Path, kind: str, verify: bool = True) -> dict[str, Any]:
    """Loads ``path/manifest.json``, checks its kind and (by default) every file's checksum.

    Raises:
        ArtifactError: the folder or manifest is missing, of another kind, lists a path
            outside the folder, or a file is missing or does not match its checksum.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{path} is not a {kind} artifact: {MANIFEST} not found")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{manifest_path} is not valid JSON: {e}") from e
    if manifest.get("kind") != kind:
        raise ArtifactError(f"{path} holds a {manifest.get('kind')!r} artifact, expected {kind!r}")
    root = path.resolve()
    for name, expected in manifest.get("files", {}).items():
        file = (path / name).resolve()
        if root not in file.parents:
            raise ArtifactError(f"{manifest_path} lists {name!r}, which is outside the artifact")
        if not file.is_file():
            raise ArtifactError(f"{path} is incomplete: {name} is missing")
        if verify and sha256_file(file) != expected:
            raise ArtifactError(f"{path / name} is corrupted: checksum does not match the manifest")
    return manifest


def publish(root: Path, write: Callable[[Path], object], keep: int = 3) -> Path:
    """Writes a new version under ``root`` and atomically makes it the current one.

    ``write(folder)`` creates the version's folder (it does not exist yet). Only once it has
    returned is the ``root/current`` symlink replaced, by a single ``rename``, so a reader
    resolving ``root`` (:func:`resolve_current`) gets the old or the new version, never a
    half-written one; a crash inside ``write`` leaves a folder nothing points to, pruned later.
    The ``keep`` newest versions stay on disk (a reader still loading the previous one is not
    pulled from under)::

        ROOT/current -> versions/20261130T221500.123456789Z-4242
        ROOT/versions/<one folder per version>

    Returns:
        The new version folder.

    Raises:
        ArtifactError: ``root`` is itself an artifact folder.
        ValueError: ``keep`` below 1.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    if (root / MANIFEST).exists():
        raise ArtifactError(f"{root} is a plain artifact folder: publish into a new root folder")
    versions = root / VERSIONS
    versions.mkdir(parents=True, exist_ok=True)
    name = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z-{os.getpid()}"
    folder = versions / name
    write(folder)
    _fsync_tree(folder)
    link = root / f".{CURRENT}.tmp-{os.getpid()}"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(Path(VERSIONS) / name, link)
    os.replace(link, root / CURRENT)  # atomic: readers follow either the old or the new link
    for old in sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith("."))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def resolve_current(path: Path) -> Path:
    """The folder ``path`` names: itself, or the version ``path/current`` points to (resolved
    once, so every file is then read from that one version)."""
    path = Path(path)
    current = path / CURRENT
    if not (path / MANIFEST).exists() and (current.is_symlink() or current.is_dir()):
        return current.resolve()
    return path
