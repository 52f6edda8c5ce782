"""Artifact manifests: ``manifest.json`` holds a folder's kind, version, metadata and every
file's SHA-256, verified on load."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection
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


def file_checksums(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


_SHA256 = re.compile(r"[0-9a-f]{64}")


def derived_version(checksums: dict[str, str]) -> str:
    """The version of an artifact written without one: a digest of its files' checksums."""
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(
    path: Path, kind: str, verify: bool = True, verified: Collection[str] = ()
) -> dict[str, Any]:
    """Loads ``path/manifest.json``, checks its structure and kind and (by default) every file's
    checksum but those of ``verified`` (files the caller knows to be the very ones it verified
    before, e.g. hard links shared with a version already loaded: :func:`same_files`).

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
        if verify and name not in verified and sha256_file(file) != expected:
            raise ArtifactError(f"{path / name} is corrupted: checksum does not match the manifest")
    return manifest


def same_files(path: Path, manifest: dict[str, Any], other: Path, other_manifest: dict[str, Any]) -> set[str]:
    """The files of ``path`` that are the very files of ``other`` (the same inode, listed with the
    same checksum in both manifests): hard links a new version shares with an older one.
    Artifacts are never modified in place, so such a file verified in ``other`` needs no
    second reading."""
    shared = set()
    theirs = other_manifest.get("files", {})
    for name, checksum in manifest.get("files", {}).items():
        if theirs.get(name) != checksum:
            continue
        try:
            a, b = os.stat(Path(path) / name), os.stat(Path(other) / name)
        except OSError:
            continue
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            shared.add(name)
    return shared


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


def refuse_outside_links(path: Path) -> None:
    """Refuses an artifact folder holding a symlink that leads outside it, listed or not: copied
    as a folder, a link to ``/`` would take the whole file system along.

    Links are looked at, never followed, so a link to ``/`` costs nothing to find.

    Raises:
        ArtifactError: names the first such link and where it leads.
    """
    root = Path(path).resolve()
    for folder, dirs, files in os.walk(path):  # followlinks=False: a linked folder is not entered
        for name in sorted([*dirs, *files]):
            entry = Path(folder) / name
            if entry.is_symlink():
                target = entry.resolve()
                if target != root and root not in target.parents:
                    raise ArtifactError(
                        f"{entry} is a symlink to {target}, outside the artifact folder {path}: refused"
                    )
