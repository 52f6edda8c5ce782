"""Folders on disk that are written whole or not at all, describe themselves and come in versions.

* :mod:`~retrieval.storage.manifest`: ``manifest.json`` (kind, version, metadata, every file's
  SHA-256) and its verification on load.
* :mod:`~retrieval.storage.folders`: atomic folder writes (a temporary folder renamed into place)
  and the clean-up of what a crash left behind.
* :mod:`~retrieval.storage.versions`: a root of ``versions/`` and the ``current`` link, switched
  atomically.

Needs only the standard library: every other layer of :mod:`retrieval` builds on it.
"""

from retrieval.storage.folders import remove_folder, remove_stale_temporaries, write_artifact
from retrieval.storage.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    ArtifactError,
    contained_file,
    derived_version,
    read_manifest,
    sha256_file,
)
from retrieval.storage.versions import CURRENT, PUBLISH_GRACE, VERSIONS, publish, resolve_current

__all__ = [
    "CURRENT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PUBLISH_GRACE",
    "VERSIONS",
    "ArtifactError",
    "contained_file",
    "derived_version",
    "publish",
    "read_manifest",
    "remove_folder",
    "remove_stale_temporaries",
    "resolve_current",
    "sha256_file",
    "write_artifact",
]
