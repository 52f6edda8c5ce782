"""The ranker artifact: a pre-ranking model (:mod:`rankers`) tied to a retrieval model's vocabulary.

Folder layout (``tools/train_ranker.py --out DIR``)::

    DIR/manifest.json          kind "ranker", version, ranker name and constructor arguments,
                               the retrieval model version it was trained against, checksums
    DIR/config.json            the resolved ranker training configuration (retrieval.ranking)
    DIR/vocab.json             the item vocabulary, identical to the retrieval model's
    DIR/ranker.weights.h5      the ranker's weights (Keras' HDF5 weights format, no pickle)
    DIR/attributes.json        attribute names, id i = names[i - 1] (when the ranker reads attributes)
    DIR/item_attributes.npy    int32 [num_items + 1, A]: each dense item's attribute ids (0 = none)
    DIR/metrics.json           retrieval-only vs reranked metrics of the training run

A ranker is only ever loaded against the vocabulary it was trained with: dense item ids mean
nothing across vocabularies, so :func:`load_ranker` refuses any other. The loaded
:class:`RankerScorer` scores dense ids through one ``tf.function`` traced once, with a fixed
input signature (batch and candidate dimensions left open, history padded to ``max_len``), so
concurrent calls from the server's threads never retrace.

The manifest's ``ranker_kwargs`` always spell out ``retrieval_score`` (whether the ranker reads
the retriever's scores) and, for DSTN, ``context_size``, and ``ranker_format`` is 2. An artifact
written before those existed (no ``ranker_format``) is loaded as what it was trained as:
``retrieval_score=False`` and DSTN's ``context_size=0`` (every other candidate); it scores without
retrieval scores, exactly as before.

A ranker reading unclicked items (DSTN, manifest ``uses_unclicked``) takes its ``unclicked`` and
``num_unclicked`` from ``config.json`` (:attr:`LoadedRanker.num_unclicked`): one trained with
``unclicked="none"`` is fed none at serving time either.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from rankers import Ranker, build_ranker
from retrieval.artifacts import MANIFEST, ArtifactError, contained_file, read_manifest, write_artifact
from retrieval.model_artifact import ModelArtifact, pad_left
from retrieval.vocab import PAD, ItemVocab
from retrieval.xla import COMPILED_BATCHES, COMPILED_WIDTHS, XlaFunction, pad_to, padded_size

XLA_ROWS = 1
"""Lists a call may hold to run compiled (``xla``); larger calls run the plain graph. In one
run of ``bench/serving.py`` (2026-12-01, 1M items, DIN over 200 candidates) the compiled
ranker cut the p99 a rerank adds at concurrency 1 from 5.3 to 4.0 ms, but with micro-batches
of several requests (8 and 32 in flight) the server spent 8.8-11.2 ms of CPU per request
against the plain graph's 5.8-5.9."""

log = logging.getLogger(__name__)

KIND = "ranker"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "ranker.weights.h5"
ATTRIBUTE_NAMES_FILE = "attributes.json"
ATTRIBUTE_TABLE_FILE = "item_attributes.npy"
METRICS_FILE = "metrics.json"
MODEL_ATTRIBUTES_FILE = "item_attributes.json"
"""The retrieval model folder's external id -> attributes (``retrieval.model_artifact``)."""

MAX_ATTRIBUTES = 16
"""Attributes kept per item (the first ones, duplicates dropped), as the item tower does."""

UNCLICKED_RANKERS = ("dstn",)
"""Rankers that read the ``unclicked`` input; the others are never given it."""

DEFAULT_UNCLICKED, DEFAULT_NUM_UNCLICKED = "previous", 20
"""How a ranker's unclicked items were built in training (``RankerConfig.unclicked`` and
``num_unclicked``, :mod:`retrieval.ranking`), the defaults for an artifact whose
``config.json`` does not say."""

RANKER_FORMAT = 2
"""Version of the ranker manifest's ``ranker_kwargs`` (2: ``retrieval_score`` and DSTN's
``context_size`` written out; absent = 1, before both existed)."""

LEGACY_KWARGS = {"retrieval_score": False}
"""What a format-1 artifact's ranker was built with (the defaults of that time)."""

LEGACY_RANKER_KWARGS = {"dstn": {"context_size": 0}}

_VARYING_WIDTHS = ("candidates", "retrieval_scores", "unclicked")
"""Scorer inputs whose width varies between calls (padded to ``COMPILED_WIDTHS`` under XLA)."""

MAX_CELLS = 16_384
"""Most ``rows × candidates`` one call of the model scores; larger requests are split into rows.
Bounds the memory of DIEN, which runs one AUGRU per (user, candidate)."""


def vocab_digest(vocab: ItemVocab) -> str:
    """SHA-256 of the vocabulary's external ids, in dense-id order (titles do not matter)."""
    return hashlib.sha256(json.dumps(list(vocab.ids), ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class AttributeTable:
    """Item attributes as ids a ranker embeds.

    Attributes:
        names: attribute values; attribute id ``i`` is ``names[i - 1]`` (0 = padding).
        table: int32 ``[num_items + 1, A]``: row ``i`` holds dense item ``i``'s attribute ids,
            left-aligned and 0-padded; row 0 (padding) is all 0.

    Example:
        >>> t = AttributeTable.from_external(vocab, {"B01": ["Lipstick", "Brand 7"]})
        >>> t.table[vocab.lookup(["B01"])[0]]  # array([1, 2], dtype=int32)
    """

    names: tuple[str, ...]
    table: np.ndarray

    @classmethod
    def from_external(
        cls,
        vocab: ItemVocab,
        item_attributes: Mapping[str, Sequence[Any]],
        max_attributes: int = MAX_ATTRIBUTES,
    ) -> AttributeTable:
        """From external item id -> attribute values (ids unknown to ``vocab`` are ignored).

        Attribute ids follow the sorted attribute names; each item keeps its first
        ``max_attributes`` distinct values.
        """
        dense = vocab.lookup(list(item_attributes))
        per_item = {
            int(d): list(dict.fromkeys(str(v) for v in values))[:max_attributes]
            for d, values in zip(dense, item_attributes.values(), strict=True)
            if d != PAD
        }
        names = tuple(sorted({v for values in per_item.values() for v in values}))
        index = {name: i + 1 for i, name in enumerate(names)}
        width = max([len(v) for v in per_item.values()] + [1])
        table = np.zeros((vocab.num_embeddings, width), np.int32)
        for item, values in per_item.items():
            table[item, : len(values)] = [index[v] for v in values]
        return cls(names, table)

    @classmethod
    def from_model(cls, model: ModelArtifact) -> AttributeTable | None:
        """The attributes saved with a retrieval model (``item_attributes.json``); ``None`` when
        the model folder has none or the attributes are empty."""
        if model.path is None or not (model.path / MODEL_ATTRIBUTES_FILE).is_file():
            return None
        raw = json.loads((model.path / MODEL_ATTRIBUTES_FILE).read_text(encoding="utf-8"))
        table = cls.from_external(model.vocab, raw)
        return table if table.names else None

    @property
    def num_attributes(self) -> int:
        return len(self.names)

    @property
    def width(self) -> int:
        """``A``, attribute slots per item."""
        return int(self.table.shape[1])


def with_attributes(inputs: Mapping[str, Any], table: Any | None) -> dict[str, Any]:
    """Adds ``history_attributes`` ``[B, L, A]`` and ``candidate_attributes`` ``[B, C, A]`` (and
    ``context_attributes`` ``[B, N, A]`` when there is a ``context``) looked up in ``table``
    (``[num_items + 1, A]``, a tensor) to the ranker inputs; unchanged without a table.

    Runs inside TensorFlow (``tf.data`` maps and the scorer's ``tf.function``), so training and
    serving embed attributes alike.
    """
    out = dict(inputs)
    if table is not None:
        out["history_attributes"] = tf.gather(table, out["history"])
        out["candidate_attributes"] = tf.gather(table, out["candidates"])
        if "context" in out:
            out["context_attributes"] = tf.gather(table, out["context"])
    return out


def context_of(candidates: np.ndarray, width: int) -> np.ndarray:
    """Each row's first ``width`` real candidates (id > 0) in the order given, 0-padded: int32
    ``[B, width]``. Candidates come in the retriever's order, so this is the request's top
    retrieved items, DSTN's ``"context"`` (:mod:`rankers.dstn`)."""
    present = candidates > 0
    order = np.argsort(~present, axis=1, kind="stable")[:, :width]  # real ones first, in order
    top = np.where(
        np.take_along_axis(present, order, axis=1), np.take_along_axis(candidates, order, axis=1), 0
    )
    return np.pad(top, ((0, 0), (0, width - top.shape[1]))).astype(np.int32)


class RankerScorer:
    """Scores candidate lists of dense item ids with a ranker; safe to call from several threads.

    The model runs inside one ``tf.function`` whose input signature fixes the history width
    (``max_len``) and leaves the batch and candidate dimensions open, so it is traced once (at
    construction) and every later call, whatever its shape, reuses that graph (called through
    its concrete function, without ``tf.function``'s per-call argument matching). The signature
    holds ``retrieval_scores`` when the ranker reads them (``model.retrieval_score``) and
    ``context`` when it reads one (``model.context_size`` > 0: DSTN's top retrieved items, taken
    here from the candidates, which callers give in the retriever's order).

    With ``xla`` the same function runs compiled by XLA (:class:`retrieval.xla.XlaFunction`, as
    the user tower's ``--xla``), on inputs zero-padded to a few shapes so that XLA compiles few
    programs: candidate and unclicked lists to :data:`~retrieval.xla.COMPILED_WIDTHS` (longer
    ones run the plain graph). Only calls of at most :data:`XLA_ROWS` lists run compiled: XLA
    shortens one request's rerank, but the plain graph scores a micro-batch of several lists
    about twice as fast per list (see :data:`XLA_ROWS`). Padding changes no
    logit: no ranker's logit of a candidate depends on padded candidates, rows or unclicked
    slots, and inference reads no batch statistics (Dice uses its moving averages).

    Args:
        model: a built ranker.
        attributes: the item attribute table the ranker was trained with (``None`` when it reads none).
        uses_unclicked: whether to feed the ``unclicked`` input (DSTN).
        xla: run the model compiled by XLA (falls back to the plain graph should XLA refuse it).

    Example:
        >>> scorer = RankerScorer(ranker, attributes, uses_unclicked=False)
        >>> candidates, scores = np.array([[12, 5, 40]]), np.array([[2.0, 1.5, 0.3]])  # retrieval order
        >>> scorer.score([np.array([3, 7, 9])], candidates, retrieval_scores=scores)  # float32 [1, 3]
    """

    def __init__(
        self, model: Ranker, attributes: AttributeTable | None, uses_unclicked: bool, xla: bool = False
    ) -> None:
        self.model = model
        self.attributes = attributes
        self.uses_unclicked = uses_unclicked
        self.max_len = int(model.max_len)
        self.num_items = int(model.num_items)
        self.uses_scores = bool(model.retrieval_score)
        self.context_width = int(model.context_size) + 1 if model.context_size else 0
        table = None if attributes is None else tf.constant(attributes.table, tf.int32)
        signature = {
            "history": tf.TensorSpec([None, self.max_len], tf.int32),
            "candidates": tf.TensorSpec([None, None], tf.int32),
        }
        if uses_unclicked:
            signature["unclicked"] = tf.TensorSpec([None, None], tf.int32)
        if self.uses_scores:
            signature["retrieval_scores"] = tf.TensorSpec([None, None], tf.float32)
        if self.context_width:
            signature["context"] = tf.TensorSpec([None, self.context_width], tf.int32)

        def logits(inputs: dict[str, tf.Tensor]) -> tf.Tensor:
            return tf.cast(model(with_attributes(inputs, table), training=False), tf.float32)

        self.function = tf.function(logits, input_signature=[signature], autograph=False)
        # Traced here, once: a first trace racing between server threads is avoided.
        self.concrete = self.function.get_concrete_function()
        self.compiled = (
            XlaFunction(logits, self.concrete, f"ranker {type(model).__name__}", signature) if xla else None
        )
        probe = {"history": np.zeros((1, self.max_len), np.int32), "candidates": np.ones((1, 1), np.int32)}
        if uses_unclicked:
            probe["unclicked"] = np.zeros((1, 1), np.int32)
        if self.uses_scores:
            probe["retrieval_scores"] = np.zeros((1, 1), np.float32)
        if self.context_width:
            probe["context"] = np.zeros((1, self.context_width), np.int32)
        self.function(probe)

    def tracing_count(self) -> int:
        """How often the model's graph was traced (1 for the scorer's whole life)."""
        return int(self.function.experimental_get_tracing_count())

    def score(
        self,
        histories: Sequence[np.ndarray],
        candidates: np.ndarray,
        unclicked: Sequence[np.ndarray] | None = None,
        retrieval_scores: np.ndarray | None = None,
    ) -> np.ndarray:
        """Click logits of each user's candidates.

        Args:
            histories: per user, dense item ids, oldest first (only the last ``max_len`` are read).
            candidates: int ``[B, C]`` dense ids in the retriever's order (best first); 0 or
                negative (a retriever's empty slot) = no item.
            unclicked: per user, dense ids of items shown and not clicked (DSTN only; ignored by
                the other rankers; ``None`` = none).
            retrieval_scores: float ``[B, C]``, the retriever's score of each candidate (what its
                search returned; any value in empty slots). Required by a ranker that reads them,
                ignored by the others.

        Item attributes come from the artifact's own table: callers give ids only.

        Returns:
            float32 ``[B, C]`` logits (higher = more likely clicked); ``-inf`` where there is no item.

        Raises:
            ValueError: mismatched lengths or shapes, an id outside ``0..num_items``, or no (or a
                non-finite) retrieval score for a ranker that reads them.
        """
        candidates = np.asarray(candidates)
        if candidates.ndim != 2 or len(candidates) != len(histories):
            raise ValueError(
                f"candidates must be [B, C] for B = {len(histories)} histories, got {list(candidates.shape)}"
            )
        present = candidates > 0
        cand = np.where(present, candidates, PAD).astype(np.int64)
        history = pad_left(histories, self.max_len)
        for name, ids in (("candidates", cand), ("histories", history)):
            if ids.size and ids.max() > self.num_items:
                raise ValueError(f"{name} hold id {int(ids.max())}, beyond the {self.num_items} items")
            if ids.size and ids.min() < 0:
                raise ValueError(f"{name} hold a negative id")
        batch, width = cand.shape
        out = np.full((batch, width), -np.inf, np.float32)
        if not batch or not width:
            return out
        inputs: dict[str, np.ndarray] = {"history": history, "candidates": cand.astype(np.int32)}
        if self.uses_unclicked:
            if unclicked is not None and len(unclicked) != batch:
                raise ValueError(f"unclicked has {len(unclicked)} rows for {batch} histories")
            rows = list(unclicked) if unclicked is not None else [np.zeros(0, np.int32)] * batch
            longest = max([len(u) for u in rows] + [1])
            shown = pad_left(rows, longest)
            if shown.size and (shown.max() > self.num_items or shown.min() < 0):
                raise ValueError(f"unclicked ids must be in 0..{self.num_items}")
            inputs["unclicked"] = shown
        if self.uses_scores:
            if retrieval_scores is None:
                raise ValueError("this ranker reads the retriever's scores: pass retrieval_scores [B, C]")
            scores = np.asarray(retrieval_scores, np.float32)
            if scores.shape != cand.shape:
                raise ValueError(f"retrieval_scores is {list(scores.shape)}, candidates {list(cand.shape)}")
            if not np.isfinite(scores[present]).all():
                raise ValueError("retrieval_scores must be finite for every candidate")
            inputs["retrieval_scores"] = np.where(present, scores, 0.0).astype(np.float32)
        if self.context_width:
            inputs["context"] = context_of(cand, self.context_width)
        step = self._rows_per_call(width)
        for start in range(0, batch, step):
            out[start : start + step] = self._run({k: v[start : start + step] for k, v in inputs.items()})
        out[~present] = -np.inf
        return out

    def _rows_per_call(self, width: int) -> int:
        """Rows one call scores: at most ``MAX_CELLS`` cells."""
        return max(1, MAX_CELLS // width)

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Logits ``[rows, width]`` of one call's inputs: compiled on zero-padded copies with
        ``xla`` (when the shapes fit its sizes), else the plain graph."""
        rows, width = inputs["candidates"].shape
        if self.compiled is not None and rows <= XLA_ROWS:
            # Rows and the candidate and unclicked lists vary; the history and context are fixed.
            widths = {
                k: padded_size(v.shape[1], COMPILED_WIDTHS) if k in _VARYING_WIDTHS else v.shape[1]
                for k, v in inputs.items()
            }
            size = padded_size(rows, COMPILED_BATCHES)
            if size is not None and None not in widths.values():
                padded = {k: tf.constant(pad_to(v, (size, widths[k] or 0))) for k, v in inputs.items()}
                return self.compiled(padded)[:rows, :width]
        return self.concrete({k: tf.constant(v) for k, v in inputs.items()}).numpy()


@dataclass(frozen=True)
class LoadedRanker:
    """A ranker artifact read from disk.

    Attributes:
        path: the folder.
        manifest: its manifest (``ranker``, ``ranker_kwargs``, ``model_version``, ...).
        vocab: the item vocabulary (identical to the retrieval model's).
        scorer: scores dense ids, see :meth:`RankerScorer.score`.
        num_unclicked: unclicked items per request the ranker was trained with (DSTN's
            ``num_unclicked``); 0 = it reads none (another ranker, or DSTN trained with
            ``unclicked="none"``), and none is fed to it.
    """

    path: Path
    manifest: dict[str, Any]
    vocab: ItemVocab
    scorer: RankerScorer
    num_unclicked: int = 0

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def name(self) -> str:
        return str(self.manifest["ranker"])

    @property
    def model_version(self) -> str:
        """Version of the retrieval model the ranker was trained against."""
        return str(self.manifest["model_version"])

    def score(
        self,
        histories: Sequence[np.ndarray],
        candidates: np.ndarray,
        unclicked: Sequence[np.ndarray] | None = None,
        retrieval_scores: np.ndarray | None = None,
    ) -> np.ndarray:
        """:meth:`RankerScorer.score`."""
        return self.scorer.score(histories, candidates, unclicked, retrieval_scores)

    @property
    def uses_scores(self) -> bool:
        """Whether the ranker reads the retriever's scores."""
        return self.scorer.uses_scores


def save_ranker(
    out: Path,
    model: Ranker,
    name: str,
    kwargs: Mapping[str, Any],
    vocab: ItemVocab,
    model_version: str,
    attributes: AttributeTable | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Writes a ranker artifact atomically (:func:`retrieval.artifacts.write_artifact`).

    Args:
        out: the folder to create.
        model: the trained, built ranker.
        name: its registered name (``din``, ``dien``, ``afm``, ``dstn``).
        kwargs: the arguments it was built with (``build_ranker(name, **kwargs)`` rebuilds it).
        vocab: the retrieval model's item vocabulary (the ranker's item ids are its dense ids).
        model_version: the retrieval model's version.
        attributes: the attribute table the ranker reads (required when ``num_attributes > 0``).
        config: the training configuration, saved as ``config.json``.
        metrics: saved as ``metrics.json``.
        overwrite: replace an existing ``out``.

    Returns:
        The manifest written.

    Raises:
        ValueError: the model, kwargs, vocabulary and attributes disagree.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    num_attributes = int(kwargs.get("num_attributes", 0))
    if int(kwargs["num_items"]) != len(vocab):
        raise ValueError(f"the ranker has {kwargs['num_items']} items, the vocabulary {len(vocab)}")
    if num_attributes and (attributes is None or attributes.num_attributes != num_attributes):
        raise ValueError(f"the ranker reads {num_attributes} attributes: give the attribute table it used")
    # The options that changed meaning across formats are written out, whatever the defaults.
    explicit: dict[str, Any] = {"retrieval_score": bool(model.retrieval_score)}
    if "context_size" in model.get_config():
        explicit["context_size"] = int(model.context_size)
    meta = {
        "ranker": name,
        "ranker_format": RANKER_FORMAT,
        "ranker_kwargs": {**dict(kwargs), **explicit},
        "model_version": model_version,
        "num_items": len(vocab),
        "max_len": int(kwargs["max_len"]),
        "num_attributes": num_attributes,
        "uses_unclicked": name in UNCLICKED_RANKERS,
        "vocab_sha256": vocab_digest(vocab),
    }
    with write_artifact(Path(out), KIND, meta, overwrite=overwrite) as tmp:
        vocab.save(tmp / VOCAB_FILE)
        model.save_weights(tmp / WEIGHTS_FILE)
        if num_attributes and attributes is not None:
            (tmp / ATTRIBUTE_NAMES_FILE).write_text(json.dumps(list(attributes.names), ensure_ascii=False))
            np.save(tmp / ATTRIBUTE_TABLE_FILE, attributes.table.astype(np.int32), allow_pickle=False)
        if config is not None:
            (tmp / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
        if metrics is not None:
            (tmp / METRICS_FILE).write_text(json.dumps(dict(metrics), indent=2))
    return read_manifest(Path(out), KIND, verify=False)


def load_ranker(
    path: Path, model: ModelArtifact | ItemVocab | None = None, verify: bool = True, xla: bool = False
) -> LoadedRanker:
    """Loads a ranker artifact written by :func:`save_ranker` (checksums verified by default).

    Args:
        path: the folder.
        model: the retrieval model (or its vocabulary) the ranker will rerank for: a ranker
            trained against another vocabulary is refused (another model version with the same
            vocabulary is accepted, with a warning). ``None`` skips the check.
        verify: check every file's SHA-256 against the manifest.
        xla: score with the ranker compiled by XLA (:class:`RankerScorer`).

    Raises:
        retrieval.artifacts.ArtifactError: missing, incomplete or corrupted folder, a vocabulary
            other than ``model``'s, or weights that do not fit the ranker the manifest describes.
    """
    path = Path(path)
    manifest = read_manifest(path, KIND, verify=verify)
    listed = set(manifest.get("files", {}))
    for required in (VOCAB_FILE, WEIGHTS_FILE):
        if required not in listed:
            raise ArtifactError(f"{path} is incomplete: {required} is not listed in the manifest")
    try:
        vocab = ItemVocab.load(contained_file(path, VOCAB_FILE))
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path / VOCAB_FILE} is not a valid vocabulary: {e}") from e
    if manifest.get("vocab_sha256") != vocab_digest(vocab):
        raise ArtifactError(f"{path / MANIFEST}: vocab_sha256 does not match {VOCAB_FILE}")
    if model is not None:
        expected = model if isinstance(model, ItemVocab) else model.vocab
        check_same_vocab(path, vocab, expected)
        if isinstance(model, ModelArtifact) and model.version != manifest.get("model_version"):
            # Same ids, another retriever: usable, but the candidates it was trained on differ.
            log.warning(
                "%s was trained against model %s, now reranking for model %s (same vocabulary)",
                path, manifest.get("model_version"), model.version,
            )  # fmt: skip
    kwargs = manifest.get("ranker_kwargs")
    name = manifest.get("ranker")
    if not isinstance(kwargs, dict) or not isinstance(name, str):
        raise ArtifactError(f"{path / MANIFEST}: ranker and ranker_kwargs are missing")
    ranker_format = manifest.get("ranker_format", 1)
    if ranker_format == 1:  # written before the options existed: rebuild it as it was trained
        kwargs = {**LEGACY_KWARGS, **LEGACY_RANKER_KWARGS.get(name, {}), **kwargs}
    elif ranker_format != RANKER_FORMAT:
        raise ArtifactError(
            f"{path / MANIFEST}: ranker_format {ranker_format!r}; this code reads 1 and {RANKER_FORMAT}"
        )
    if kwargs.get("num_items") != len(vocab):
        raise ArtifactError(
            f"{path / MANIFEST}: the ranker has {kwargs.get('num_items')} items, {VOCAB_FILE} {len(vocab)}"
        )
    attributes = _load_attributes(path, manifest, listed, len(vocab))
    num_unclicked = _num_unclicked(path, manifest, listed)
    try:
        ranker = build_ranker(name, **kwargs)
        ranker.build()
        ranker.load_weights(contained_file(path, WEIGHTS_FILE))
    except Exception as e:  # unknown name, bad kwargs, weights of another architecture
        text = str(e).strip().splitlines()
        raise ArtifactError(
            f"{path}: cannot rebuild ranker {name!r} from its weights: {type(e).__name__}: "
            f"{text[0][:300] if text else ''}"
        ) from e
    scorer = RankerScorer(ranker, attributes, num_unclicked > 0, xla=xla)
    return LoadedRanker(path, manifest, vocab, scorer, num_unclicked)


def _num_unclicked(path: Path, manifest: dict[str, Any], listed: set[str]) -> int:
    """Unclicked items per request the ranker was trained with: 0 unless the manifest says it
    reads them (``uses_unclicked``, DSTN) and its ``config.json`` does not say ``unclicked="none"``;
    else the config's ``num_unclicked`` (the training defaults without a config).

    Raises:
        ArtifactError: an unreadable config, or an unclicked mode or count it cannot be.
    """
    if not manifest.get("uses_unclicked"):
        return 0
    config: dict[str, Any] = {}
    if CONFIG_FILE in listed:
        try:
            config = dict(json.loads(contained_file(path, CONFIG_FILE).read_text(encoding="utf-8")))
        except (ValueError, TypeError, OSError, RecursionError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{path / CONFIG_FILE} is not a valid configuration: {e}") from e
    mode = config.get("unclicked", DEFAULT_UNCLICKED)
    count = config.get("num_unclicked", DEFAULT_NUM_UNCLICKED)
    if mode not in ("previous", "none") or isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ArtifactError(
            f"{path / CONFIG_FILE}: unclicked {mode!r} with num_unclicked {count!r}; expected "
            "'previous' or 'none' and a positive count"
        )
    return 0 if mode == "none" else count


def check_same_vocab(path: Path, vocab: ItemVocab, expected: ItemVocab) -> None:
    """Refuses a ranker (at ``path``) whose item vocabulary is not ``expected``.

    Raises:
        ArtifactError: the vocabularies differ (the message names the first difference).
    """
    if vocab.ids == expected.ids:
        return
    if len(vocab) != len(expected):
        detail = f"{len(vocab)} items, the model has {len(expected)}"
    else:
        first = next(i for i, (a, b) in enumerate(zip(vocab.ids, expected.ids, strict=True)) if a != b)
        detail = f"dense id {first + 1} is {vocab.ids[first]!r} there, {expected.ids[first]!r} in the model"
    raise ArtifactError(
        f"{path} was trained against another item vocabulary ({detail}): its item ids mean "
        "other items for this model; retrain it with tools/train_ranker.py against this model"
    )


def _load_attributes(
    path: Path, manifest: dict[str, Any], listed: set[str], num_items: int
) -> AttributeTable | None:
    """The attribute table, checked against the manifest; ``None`` for a ranker without attributes."""
    num_attributes = manifest.get("num_attributes", 0)
    if not num_attributes:
        return None
    for required in (ATTRIBUTE_NAMES_FILE, ATTRIBUTE_TABLE_FILE):
        if required not in listed:
            raise ArtifactError(f"{path} is incomplete: {required} is not listed in the manifest")
    try:
        names = json.loads(contained_file(path, ATTRIBUTE_NAMES_FILE).read_text(encoding="utf-8"))
        table = np.load(contained_file(path, ATTRIBUTE_TABLE_FILE), allow_pickle=False)
    except (ValueError, OSError, EOFError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: unreadable attribute files: {e}") from e
    if not isinstance(names, list) or len(names) != num_attributes:
        raise ArtifactError(f"{path / ATTRIBUTE_NAMES_FILE}: expected {num_attributes} attribute names")
    if (
        table.dtype != np.int32
        or table.ndim != 2
        or table.shape[0] != num_items + 1
        or (table.size and (table.min() < 0 or table.max() > num_attributes))
    ):
        raise ArtifactError(
            f"{path / ATTRIBUTE_TABLE_FILE}: expected int32 [{num_items + 1}, A] ids in 0..{num_attributes}"
        )
    return AttributeTable(tuple(str(n) for n in names), table)
