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
from typing import TYPE_CHECKING, Any

import numpy as np

from retrieval.artifacts.ranker_inputs import AttributeTable
from retrieval.data.vocab import ItemVocab
from retrieval.storage.folders import write_artifact
from retrieval.storage.manifest import MANIFEST, ArtifactError, contained_file, read_manifest

if TYPE_CHECKING:  # for types only: load_ranker imports TensorFlow and the scorer when it runs
    from rankers import Ranker
    from retrieval.artifacts.model import ModelArtifact
    from retrieval.artifacts.ranker_scorer import RankerScorer

log = logging.getLogger(__name__)


KIND = "ranker"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "ranker.weights.h5"
ATTRIBUTE_NAMES_FILE = "attributes.json"
ATTRIBUTE_TABLE_FILE = "item_attributes.npy"
METRICS_FILE = "metrics.json"

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


def vocab_digest(vocab: ItemVocab) -> str:
    """SHA-256 of the vocabulary's external ids, in dense-id order (titles do not matter)."""
    digest = hashlib.sha256()
    for piece in vocab.ids_json():
        digest.update(piece.encode())
    return digest.hexdigest()


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
        """:meth:`RankerScorer.score`; items added to the catalogue after the ranker was trained
        (dense ids past its vocabulary, :func:`check_same_vocab`) are read as unknown (0)."""
        n = len(self.vocab)

        def known(ids: np.ndarray) -> np.ndarray:
            return np.where(ids > n, 0, ids)

        unread = None if unclicked is None else [known(u) for u in unclicked]
        return self.scorer.score([known(h) for h in histories], known(candidates), unread, retrieval_scores)

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
    """Writes a ranker artifact atomically (:func:`retrieval.storage.folders.write_artifact`).

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
    meta = {
        "ranker": name,
        "ranker_format": RANKER_FORMAT,
        "ranker_kwargs": {**dict(kwargs), **_explicit_kwargs(model)},
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


def _explicit_kwargs(model: Ranker) -> dict[str, Any]:
    """The options that changed meaning across formats, written out whatever the defaults."""
    explicit: dict[str, Any] = {"retrieval_score": bool(model.retrieval_score)}
    if "context_size" in model.get_config():
        explicit["context_size"] = int(model.context_size)
    return explicit


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
        retrieval.storage.manifest.ArtifactError: missing, incomplete or corrupted folder, a vocabulary
            other than ``model``'s, or weights that do not fit the ranker the manifest describes.
    """
    path = Path(path)
    manifest = read_manifest(path, KIND, verify=verify)
    listed = set(manifest.get("files", {}))
    vocab = _load_vocab(path, manifest, listed)
    if model is not None:
        _check_model(path, manifest, vocab, model)
    name, kwargs = _ranker_kwargs(path, manifest, len(vocab))
    attributes = _load_attributes(path, manifest, listed, len(vocab))
    num_unclicked = _num_unclicked(path, manifest, listed)
    from retrieval.artifacts.ranker_scorer import RankerScorer

    scorer = RankerScorer(_rebuild(path, name, kwargs), attributes, num_unclicked > 0, xla=xla)
    return LoadedRanker(path, manifest, vocab, scorer, num_unclicked)


def _load_vocab(path: Path, manifest: dict[str, Any], listed: set[str]) -> ItemVocab:
    """The ranker's item vocabulary, checked against the manifest's digest; refuses a folder
    whose manifest does not list the vocabulary and the weights."""
    for required in (VOCAB_FILE, WEIGHTS_FILE):
        if required not in listed:
            raise ArtifactError(f"{path} is incomplete: {required} is not listed in the manifest")
    try:
        vocab = ItemVocab.load(contained_file(path, VOCAB_FILE))
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path / VOCAB_FILE} is not a valid vocabulary: {e}") from e
    if manifest.get("vocab_sha256") != vocab_digest(vocab):
        raise ArtifactError(f"{path / MANIFEST}: vocab_sha256 does not match {VOCAB_FILE}")
    return vocab


def _check_model(
    path: Path, manifest: dict[str, Any], vocab: ItemVocab, model: ModelArtifact | ItemVocab
) -> None:
    """Refuses a ranker trained on another vocabulary than ``model``'s; warns when it was trained
    against another version of the model with the same vocabulary."""
    expected = model if isinstance(model, ItemVocab) else model.vocab
    check_same_vocab(path, vocab, expected)
    if not isinstance(model, ItemVocab) and model.version != manifest.get("model_version"):
        # Same ids, another retriever: usable, but the candidates it was trained on differ.
        log.warning(
            "%s was trained against model %s, now reranking for model %s (same vocabulary)",
            path, manifest.get("model_version"), model.version,
        )  # fmt: skip


def _ranker_kwargs(path: Path, manifest: dict[str, Any], num_items: int) -> tuple[str, dict[str, Any]]:
    """The ranker's name and constructor arguments (a format-1 artifact's as it was trained),
    checked against the vocabulary's ``num_items``."""
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
    if kwargs.get("num_items") != num_items:
        raise ArtifactError(
            f"{path / MANIFEST}: the ranker has {kwargs.get('num_items')} items, {VOCAB_FILE} {num_items}"
        )
    return name, kwargs


def _rebuild(path: Path, name: str, kwargs: dict[str, Any]) -> Ranker:
    """The ranker ``name`` built from ``kwargs`` with the folder's weights."""
    from rankers import build_ranker

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
    return ranker


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
    """Refuses a ranker (at ``path``) whose item vocabulary is not ``expected`` or its beginning
    (a catalogue that grew since the ranker was trained: ``mitt add-items`` appends items).

    Raises:
        ArtifactError: the vocabularies differ (the message names the first difference).
    """
    first = vocab.first_difference(expected)
    if first is None and len(vocab) <= len(expected):
        return
    if first is None or len(vocab) != len(expected):
        detail = f"{len(vocab)} items, the model has {len(expected)}"
    else:
        (there,), (here,) = vocab.external([first + 1]), expected.external([first + 1])
        detail = f"dense id {first + 1} is {there!r} there, {here!r} in the model"
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
