"""The retriever: a user history in, the top-k items over the user's interests out (no gRPC)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from index import FaissIndex
from retrieval.artifacts import ArtifactError, read_manifest
from retrieval.errors import InvalidArgument
from retrieval.features import encode_events
from retrieval.index_artifact import load_index
from retrieval.model_artifact import KIND as MODEL_KIND
from retrieval.model_artifact import ModelArtifact, load_model
from retrieval.search import search_interests
from retrieval.vocab import PAD

MAX_K = 1000
"""Most items one request may ask for (the API's documented limit)."""

MAX_HISTORY = 10_000
"""Most history ids one request may send; the user tower reads only the last ``max_len``, but
every id is excluded from the results, so the whole history is looked up."""


@dataclass(frozen=True)
class Retrieved:
    """Answer to one request.

    Attributes:
        items: ``(external id, score, interest)``, best first, never an item of the history.
        unknown_items: history ids missing from the vocabulary (skipped).
        model_version: version of the model (and of the index built from it) that answered.
    """

    items: list[tuple[str, float, int]]
    unknown_items: int
    model_version: str


class Retriever:
    """Turns a history of external item ids into the top-k items across the user's K interests.

    Safe to call from several threads: it only reads the model and the index.

    Example:
        >>> retriever = Retriever.from_dirs(Path("runs/model"), Path("runs/index"))
        >>> retriever.retrieve(["B0001", "B0042"], k=10).items[0]
        ('B0107', 3.52, 1)
    """

    def __init__(
        self, model: ModelArtifact, index: FaissIndex, index_model_version: str | None = None
    ) -> None:
        """Pairs a model with an index of its item embeddings.

        Args:
            model: the model whose user tower encodes histories.
            index: items indexed under the model's dense ids.
            index_model_version: version of the model the index was built from (its manifest's
                ``model_version``); ``None`` when the index was just built from ``model``.

        Raises:
            ArtifactError: the index was built from another model or has another dimension.
        """
        if index_model_version is not None and index_model_version != model.version:
            raise ArtifactError(
                f"index built from model {index_model_version!r} cannot serve model {model.version!r}"
            )
        if index.dim != model.dim:
            raise ArtifactError(f"index has dimension {index.dim}, model {model.dim}")
        self.model = model
        self.index = index

    @classmethod
    def from_dirs(cls, model_dir: Path, index_dir: Path) -> Retriever:
        """Loads a model folder and an index folder, refusing an index built from another model.

        The versions are compared before the model's TensorFlow graph is loaded, so a mismatch
        fails fast.

        Raises:
            ArtifactError: a folder is missing or corrupted, or the versions differ.
        """
        model_version = str(read_manifest(Path(model_dir), MODEL_KIND, verify=False)["version"])
        index, manifest = load_index(Path(index_dir), expected_model_version=model_version)
        return cls(load_model(Path(model_dir)), index, manifest["model_version"])

    @property
    def model_version(self) -> str:
        return self.model.version

    def retrieve(
        self,
        history: Sequence[str],
        k: int,
        timestamps: Sequence[int] | None = None,
        actions: Sequence[str] | None = None,
    ) -> Retrieved:
        """Top-``k`` items for one user.

        Args:
            history: external item ids, oldest first (unknown ids are skipped and counted).
            k: number of items wanted, ``1..MAX_K``.
            timestamps, actions: per history event, for models trained with side features
                (``gap_prev``, ``action``); ignored by models without them.

        Raises:
            InvalidArgument: ``k`` out of range, history empty, longer than ``MAX_HISTORY`` or
                without any known id, side information not aligned with the history.
        """
        if not 1 <= k <= MAX_K:
            raise InvalidArgument(f"k must be between 1 and {MAX_K}, got {k}")
        if not history:
            raise InvalidArgument("history is empty: send at least one item id")
        if len(history) > MAX_HISTORY:
            raise InvalidArgument(f"history has {len(history)} ids, at most {MAX_HISTORY} are accepted")
        for name, values in (("timestamps", timestamps), ("actions", actions)):
            if values is not None and len(values) != len(history):
                raise InvalidArgument(f"{len(values)} {name} for a history of {len(history)} events")
        dense = self.model.vocab.lookup(history)
        is_known = dense != PAD
        known = dense[is_known]
        if not len(known):
            raise InvalidArgument(f"none of the {len(history)} history ids is in the model's vocabulary")
        # Side features come from the whole timeline (a gap is to the previous event, known or
        # not), then follow their items, exactly as in training and evaluation.
        events = encode_events(self.model.side, timestamps, actions)
        features = {
            name: [values[is_known]] for name, values in events.items() if len(values) == len(history)
        }

        interests = self.model.encode([known], features)  # [1, K, d], one user-tower call
        result = search_interests(self.index, interests, k, exclude=[np.unique(known)])
        found = result.ids[0] >= 0
        items = list(
            zip(
                self.model.vocab.external(result.ids[0][found]),
                result.scores[0][found].tolist(),
                result.interests[0][found].tolist(),
                strict=True,
            )
        )
        return Retrieved(items, unknown_items=len(history) - len(known), model_version=self.model_version)
