"""Float tables in artifact folders (``.npy``), read without pickle and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from retrieval.storage.manifest import ArtifactError


def load_vectors(file: Path, rows: int, dim: int, *, mmap: Literal["r", "c"] | None = None) -> np.ndarray:
    """A ``.npy`` table, read without pickle and checked: float32 ``[rows, dim]``, finite.

    ``mmap``: map the file instead of reading it (``np.load``'s ``mmap_mode``: ``"r"``
    read-only, ``"c"`` copy-on-write, for :func:`shared_tensor`): the processes of a serving
    group that load the same version then share its pages.

    Raises:
        ArtifactError: an unreadable file, or another shape, type or non-finite values.
    """
    try:
        table = np.load(file, mmap_mode=mmap, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # a bad header, pickled objects, a short file
        raise ArtifactError(f"{file} is not a readable .npy array: {e}") from e
    return checked_vectors(table, rows, dim, str(file))


def scored_rows(vectors: np.ndarray, similarity: str) -> np.ndarray:
    """Item vectors ``[n, d]`` as a model of ``similarity`` scores them: ``vectors`` itself for
    ``"dot"``, scaled to unit length (zero rows left zero, float32) for ``"cosine"``."""
    if similarity != "cosine":
        return vectors
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, np.finfo(np.float32).tiny)).astype(np.float32)


def checked_vectors(table: np.ndarray, rows: int, dim: int, where: str) -> np.ndarray:
    """``table`` if it is float32 ``[rows, dim]`` and finite.

    Raises:
        ArtifactError: it is not (the message starts with ``where``).
    """
    if table.dtype != np.float32 or table.ndim != 2 or table.shape[0] != rows:
        raise ArtifactError(f"{where} holds {table.dtype} {list(table.shape)}, expected float32 [{rows}, d]")
    if table.shape[1] != dim:
        raise ArtifactError(f"{where} has dimension {table.shape[1]}, the manifest says {dim}")
    if not np.isfinite(table).all():
        raise ArtifactError(f"{where} holds NaN or infinite values")
    return table


def shared_tensor(table: np.ndarray) -> Any:
    """A TensorFlow tensor over ``table``'s own memory (DLPack), where ``tf.constant`` would
    copy it: over a file mapped copy-on-write (``load_vectors(mmap="c")``; DLPack refuses a
    read-only array, and nothing writes), the pages stay those every process mapping the
    file shares."""
    import tensorflow as tf

    return tf.experimental.dlpack.from_dlpack(table.__dlpack__())
