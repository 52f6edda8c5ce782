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
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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
