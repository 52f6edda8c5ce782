"""A deployment: a model and the index built from it, published together as one version.

Layout (``tools/deploy.py --root ROOT``), swapped atomically by :func:`retrieval.artifacts.publish`::

    ROOT/current -> versions/<version>
    ROOT/versions/<version>/model/   the model artifact
    ROOT/versions/<version>/index/   an index artifact built from that model

``tools/serve.py --watch ROOT`` serves the current version and moves to each new one without
downtime (:class:`retrieval.reload.DeploymentWatcher`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from retrieval.artifacts import PUBLISH_GRACE, ArtifactError, publish, read_manifest, resolve_current
from retrieval.index_artifact import KIND as INDEX_KIND
from retrieval.model_artifact import KIND as MODEL_KIND

MODEL_DIR = "model"
INDEX_DIR = "index"


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-links a file (artifacts are never modified in place), copying across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def publish_deployment(
    model_dir: Path, index_dir: Path, root: Path, keep: int = 3, grace: float = PUBLISH_GRACE
) -> Path:
    """Publishes a model and its index as the new current version of ``root``.

    Both artifacts are verified (checksums, and the index built from this very model) before
    anything is written.

    Args:
        model_dir: a model artifact folder.
        index_dir: an index artifact folder (or a published index root) built from that model.
        keep, grace: which old versions stay on disk (:func:`retrieval.artifacts.publish`).

    Returns:
        The new version folder.

    Raises:
        ArtifactError: an artifact is missing or corrupted, or the index was built from
            another model.
    """
    model_dir, index_dir = Path(model_dir), resolve_current(Path(index_dir))
    model_version = read_manifest(model_dir, MODEL_KIND)["version"]
    index_version = read_manifest(index_dir, INDEX_KIND)["model_version"]
    if index_version != model_version:
        raise ArtifactError(f"{index_dir} was built from model {index_version!r}, not {model_version!r}")

    def write(folder: Path) -> None:
        folder.mkdir()
        shutil.copytree(model_dir, folder / MODEL_DIR, copy_function=_link_or_copy)
        shutil.copytree(index_dir, folder / INDEX_DIR, copy_function=_link_or_copy)

    return publish(root, write, keep, grace)


def deployment_dirs(root: Path) -> tuple[Path, Path]:
    """``(model folder, index folder)`` of the current version of ``root``.

    Raises:
        ArtifactError: ``root`` has no current version holding both.
    """
    folder = resolve_current(Path(root))
    model_dir, index_dir = folder / MODEL_DIR, folder / INDEX_DIR
    if not (model_dir.is_dir() and index_dir.is_dir()):
        raise ArtifactError(
            f"{root} is not a deployment: no current version with {MODEL_DIR}/ and {INDEX_DIR}/"
        )
    return model_dir, index_dir
