"""The public API of :mod:`retrieval.storage` (loaded on first use by ``__init__.py``)."""

from .folders import derive_folder, link_or_copy, remove_folder, remove_stale_temporaries, write_artifact
from .manifest import (
    FORMAT_VERSION,
    MANIFEST,
    ArtifactError,
    contained_file,
    derived_version,
    read_manifest,
    refuse_outside_links,
    sha256_file,
)
from .versions import CURRENT, PUBLISH_GRACE, VERSIONS, publish, resolve_current, version_folders

__all__ = [
    "CURRENT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PUBLISH_GRACE",
    "VERSIONS",
    "ArtifactError",
    "contained_file",
    "derive_folder",
    "derived_version",
    "link_or_copy",
    "publish",
    "read_manifest",
    "refuse_outside_links",
    "remove_folder",
    "remove_stale_temporaries",
    "resolve_current",
    "sha256_file",
    "version_folders",
    "write_artifact",
]
