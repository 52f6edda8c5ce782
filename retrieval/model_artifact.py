"""The trained-model artifact: what serving, evaluation and indexing read.

Folder layout (``tools/train.py --out DIR``)::

    DIR/manifest.json         kind "model", version, tower, dim, num_interests, max_len, checksums
    DIR/config.json           the resolved training configuration
    DIR/vocab.json            item vocabulary (external ids, titles when the data has them)
    DIR/item_attributes.json  external id -> attributes (genres, categories), when the data has them
    DIR/side_vocab.json       side features the tower reads and their vocabularies, when it reads any
    DIR/item_embeddings.npy   float32 [num_items + 1, d]; row i is dense item i, row 0 padding
    DIR/user_tower/           SavedModel, endpoint ``user_vectors({"items": [B, L], ...}) -> [B, K, d]``
    DIR/model.keras           the full Keras two-tower model (to fine-tune or inspect)
    DIR/metrics.json          validation and test metrics
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.artifacts import read_manifest
from retrieval.features import SideVocab
from retrieval.vocab import ItemVocab

KIND = "model"
SIDE_FILE = "side_vocab.json"
Features = Mapping[str, Sequence[np.ndarray]]
"""Side feature name -> per user, int values aligned with the history."""

UserVectorsFn = Callable[[dict[str, np.ndarray]], np.ndarray]
"""``{"items": int32 [B, L], <side feature>: int32 [B, L], ...}``, left-padded (``L <= max_len``,
0 = padding) -> float32 ``[B, K, d]``."""


@dataclass(frozen=True)
class ModelArtifact:
    """A loaded model artifact.

    Attributes:
        path: the folder it was read from (``None`` when built in memory).
        manifest: the folder's manifest (``version``, ``tower``, ``dim``, ``num_interests``, ``max_len``).
        vocab: the item vocabulary.
        item_embeddings: float32 ``[num_items + 1, d]``; row 0 (padding) is never retrieved.
        user_vectors: the user tower, see :data:`UserVectorsFn`.
        side: the side features the tower reads (none by default).
    """

    path: Path | None
    manifest: dict[str, Any]
    vocab: ItemVocab
    item_embeddings: np.ndarray
    user_vectors: UserVectorsFn
    side: SideVocab = field(default_factory=SideVocab)

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def max_len(self) -> int:
        return int(self.manifest["max_len"])

    @property
    def num_interests(self) -> int:
        return int(self.manifest["num_interests"])

    @property
    def dim(self) -> int:
        return int(self.item_embeddings.shape[1])

    def encode(self, histories: Sequence[np.ndarray], features: Features | None = None) -> np.ndarray:
        """Dense-id histories (oldest first) -> interests float32 ``[B, K, d]``.

        Args:
            histories: per user, dense item ids.
            features: per side feature the tower reads, per user an int array aligned with
                the history (see ``retrieval.features.encode_events``); missing = unknown (0).

        Each history is cut to its last ``max_len`` events and left-padded with 0.
        """
        inputs = {"items": pad_left(histories, self.max_len)}
        for name in self.side.event_features:
            given = (features or {}).get(name)
            inputs[name] = (
                pad_left(given, self.max_len) if given is not None else np.zeros_like(inputs["items"])
            )
        return self.user_vectors(inputs)


def pad_left(histories: Sequence[np.ndarray], max_len: int) -> np.ndarray:
    """Keeps the last ``max_len`` ids of each history, left-padded with 0: int32 ``[B, max_len]``."""
    out = np.zeros((len(histories), max_len), np.int32)
    for row, h in zip(out, histories, strict=True):
        tail = np.asarray(h)[-max_len:]
        if len(tail):
            row[max_len - len(tail) :] = tail
    return out


def load_model(path: Path, verify: bool = True) -> ModelArtifact:
    """Loads a model artifact written by ``tools/train.py`` (checksums verified by default).

    Raises:
        retrieval.artifacts.ArtifactError: missing, incomplete or corrupted folder.
    """
    import tensorflow as tf

    path = Path(path)
    manifest = read_manifest(path, KIND, verify=verify)
    vocab = ItemVocab.load(path / "vocab.json")
    item_embeddings = np.load(path / "item_embeddings.npy", allow_pickle=False)
    # The closure holds the loaded object itself: its endpoint alone does not keep the
    # variables alive, and TensorFlow frees them once the object is collected.
    exported = tf.saved_model.load(str(path / "user_tower"))

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return exported.user_vectors({k: tf.constant(v, tf.int32) for k, v in inputs.items()}).numpy()

    side = SideVocab.load(path / SIDE_FILE) if (path / SIDE_FILE).is_file() else SideVocab()
    return ModelArtifact(path, manifest, vocab, item_embeddings, user_vectors, side)
