"""Folders on disk that are written whole or not at all, describe themselves and come in versions.

* :mod:`~retrieval.storage.manifest`: ``manifest.json`` (kind, version, metadata, every file's
  SHA-256) and its verification on load.
* :mod:`~retrieval.storage.folders`: atomic folder writes (a temporary folder renamed into place)
  and the clean-up of what a crash left behind.
* :mod:`~retrieval.storage.versions`: a root of ``versions/`` and the ``current`` link, switched
  atomically.

Needs only the standard library: every other layer of :mod:`retrieval` builds on it.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
