"""A deployment: a model and the index built from it, published together as one version.

Layout (``tools/deploy.py --root ROOT``), swapped atomically by :func:`retrieval.storage.versions.publish`::

    ROOT/current -> versions/<version>
    ROOT/versions/<version>/model/   the model artifact
    ROOT/versions/<version>/index/   an index artifact built from that model
    ROOT/versions/<version>/rankers/<name>/   optional rankers trained against that model's items

``tools/serve.py --watch ROOT`` serves the current version and moves to each new one without
downtime (:class:`retrieval.serving.reload.DeploymentWatcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from retrieval.artifacts.index import KIND as INDEX_KIND
from retrieval.artifacts.model import KIND as MODEL_KIND
from retrieval.artifacts.model import read_model_vocab
from retrieval.storage.folders import link_or_copy
from retrieval.storage.manifest import (
    MANIFEST,
    ArtifactError,
    contained_file,
    read_manifest,
    refuse_outside_links,
)
from retrieval.storage.versions import PUBLISH_GRACE, publish, resolve_current

MODEL_DIR = "model"
INDEX_DIR = "index"
RANKERS_DIR = "rankers"


def copy_listed(src: Path, manifest: Mapping[str, Any], dst: Path) -> None:
    """Links or copies ``src``'s manifest and the files it lists into the new folder ``dst``, and
    nothing else: a file added after writing, or a folder linked in, stays behind."""
    for name in [MANIFEST, *manifest["files"]]:
        target = dst / name
        target.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(contained_file(src, name), target)


def publish_deployment(
    model_dir: Path,
    index_dir: Path,
    root: Path,
    keep: int = 3,
    grace: float = PUBLISH_GRACE,
    ranker_dirs: Sequence[Path] = (),
    check: Callable[[Path], object] | None = None,
) -> Path:
    """Publishes a model, its index and optional rankers as the new current version of ``root``.

    Every artifact is verified (checksums, no symlink leading out of its folder, the index built
    from this very model, each ranker trained against this model's item vocabulary) before
    anything is written; only the files each manifest lists are copied. ``check`` then tries the
    complete version before it can become current.

    Args:
        model_dir: a model artifact folder.
        index_dir: an index artifact folder (or a published index root) built from that model.
        keep: how many of the newest versions stay on disk
            (:func:`retrieval.storage.versions.publish`).
        grace: seconds an older version stays on disk after it stopped being current (idem).
        ranker_dirs: ranker artifact folders (``tools/train_ranker.py``), one per ranker name.
        check: called with the new version's folder before it is renamed into ``versions/``
            (``mitt deploy`` loads it as a server would:
            :func:`retrieval.serving.reload.load_deployment`); whatever it raises refuses the
            version, which is removed, and ``current`` stays as it was.

    Returns:
        The new version folder.

    Raises:
        ArtifactError: an artifact is missing or corrupted, the index was built from another
            model, a ranker has another item vocabulary, or two rankers share a name.
    """
    model_dir, index_dir = Path(model_dir), resolve_current(Path(index_dir))
    model_manifest = read_manifest(model_dir, MODEL_KIND)
    index_manifest = read_manifest(index_dir, INDEX_KIND)
    model_version, index_version = model_manifest["version"], index_manifest["model_version"]
    if index_version != model_version:
        raise ArtifactError(f"{index_dir} was built from model {index_version!r}, not {model_version!r}")
    parts = [(model_dir, model_manifest, Path(MODEL_DIR)), (index_dir, index_manifest, Path(INDEX_DIR))]
    rankers: dict[str, Path] = {}
    if ranker_dirs:
        from retrieval.artifacts.ranker import KIND as RANKER_KIND  # TensorFlow: only with rankers
        from retrieval.artifacts.ranker import vocab_digest

        digest = vocab_digest(read_model_vocab(model_dir))  # catalogue changes included
        for ranker_dir in map(Path, ranker_dirs):
            manifest = read_manifest(ranker_dir, RANKER_KIND)
            if manifest.get("vocab_sha256") != digest:
                raise ArtifactError(
                    f"{ranker_dir} was trained against another item vocabulary than {model_dir}"
                )
            name = str(manifest["ranker"])
            if name in rankers:
                raise ArtifactError(f"two rankers are named {name!r}: {rankers[name]}, {ranker_dir}")
            rankers[name] = ranker_dir
            parts.append((ranker_dir, manifest, Path(RANKERS_DIR) / name))
    for src, _, _ in parts:
        refuse_outside_links(src)

    def write(folder: Path) -> None:
        folder.mkdir()
        for src, manifest, sub in parts:
            copy_listed(src, manifest, folder / sub)
        if check is not None:
            check(folder)

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


def deployment_rankers(root: Path) -> list[Path]:
    """The ranker folders of the current version of ``root`` (or of one version folder)."""
    rankers = resolve_current(Path(root)) / RANKERS_DIR
    return sorted(p for p in rankers.iterdir() if p.is_dir()) if rankers.is_dir() else []
