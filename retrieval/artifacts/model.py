"""The trained-model artifact: what serving, evaluation and indexing read.

Folder layout (``tools/train.py --out DIR``)::

    DIR/manifest.json         kind "model", version, tower, dim, num_interests, max_len, checksums
    DIR/config.json           the resolved training configuration
    DIR/vocab.json            item vocabulary (external ids, titles when the data has them)
    DIR/item_attributes.json  external id -> attributes (genres, categories), when the data has them
    DIR/side_vocab.json       side features the tower reads and their vocabularies, when it reads any
    DIR/item_embeddings.npy   float32 [num_items + 1, d]; row i is dense item i, row 0 padding
    DIR/attribute_embeddings.npy  float32 [attributes + 1, d], the item tower's attribute part
                              (in the order of side_vocab.json's attributes), when it has one:
                              what embeds an item added after training (cold start)
    DIR/removed_items.json    external ids removed from the catalogue (never indexed), if any
    DIR/catalogue_changes.json, catalogue_vectors.npy
                              items added, updated and removed since the files above were
                              written, when a catalogue change wrote the folder
                              (:mod:`retrieval.artifacts.changes`; ``num_items`` counts them)
    DIR/user_tower/           SavedModel, endpoint ``user_vectors({"items": [B, L], ...}, item_vectors)
                              -> [B, K, d]`` and, when the manifest's ``explanation`` is "attention"
                              or "routing", ``interest_weights`` (same inputs) -> ``[B, K, L]``;
                              it reads the dense ids ``1..tower_items`` (manifest; the items
                              known at training, all of them unless some were added since)
    DIR/user_tower/item_vectors.npy
                              the ``item_vectors`` the endpoints read: float32
                              ``[tower_items + 1, d]``, the item table at training (a hard link of
                              item_embeddings.npy until a catalogue change rewrites that). A
                              SavedModel written before it holds its own table and takes no
                              ``item_vectors``
    DIR/model.keras           the full Keras two-tower model (to fine-tune or inspect)
    DIR/metrics.json          validation and test metrics
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from retrieval.artifacts.arrays import load_vectors, shared_tensor
from retrieval.artifacts.changes import (
    CHANGE_VECTORS_FILE,
    CHANGES_FILE,
    CatalogueChanges,
    changed_attributes,
    grown_vocab,
)
from retrieval.artifacts.xla import COMPILED_BATCHES, XlaFunction, pad_to, padded_size
from retrieval.data.features import SideVocab
from retrieval.data.vocab import PAD, ItemVocab
from retrieval.storage.manifest import MANIFEST, ArtifactError, contained_file, read_manifest, same_files

KIND = "model"
SIDE_FILE = "side_vocab.json"
Features = Mapping[str, Sequence[np.ndarray]]
"""Side feature name -> per user, int values aligned with the history."""

UserVectorsFn = Callable[[dict[str, np.ndarray]], np.ndarray]
"""``{"items": int32 [B, L], <side feature>: int32 [B, L], ...}``, left-padded (``L <= max_len``,
0 = padding) -> float32 ``[B, K, d]``."""

InterestWeightsFn = Callable[[dict[str, np.ndarray]], np.ndarray]
"""The same inputs as :data:`UserVectorsFn` -> float32 ``[B, K, L]``: per interest, the weight of
each input position (``UserTower.interest_weights``)."""

EXPLANATIONS = ("attention", "routing", "none")
"""Values of the manifest's ``explanation``: what the tower's ``interest_weights`` are."""


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
        interest_weights: the tower's per-interest weights over the history, see
            :data:`InterestWeightsFn`; ``None`` when the artifact has none (:attr:`explanation`).
        attribute_embeddings: float32 ``[len(side.attributes) + 1, d]``, the item tower's
            attribute part (row 0 = none), when it has one (cold start).
        removed: sorted int64 dense ids removed from the catalogue: never indexed.
        changes: the catalogue changes layered over the folder's files
            (:mod:`retrieval.artifacts.changes`), already applied to the fields above; ``None``
            without any.
        grown_from: the version of the model (``load_model``'s ``reuse``) over whose catalogue
            the changes were applied; ``None`` when they were applied over the folder's files.
    """

    path: Path | None
    manifest: dict[str, Any]
    vocab: ItemVocab
    item_embeddings: np.ndarray
    user_vectors: UserVectorsFn
    side: SideVocab = field(default_factory=SideVocab)
    interest_weights: InterestWeightsFn | None = None
    attribute_embeddings: np.ndarray | None = None
    removed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    changes: CatalogueChanges | None = None
    grown_from: str | None = None

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def tower_items(self) -> int:
        """The dense ids ``1..tower_items`` the user tower reads in histories: the items known
        at training (items added since are retrieved but not read as history)."""
        return int(self.manifest.get("tower_items", len(self.vocab)))

    @property
    def explanation(self) -> str:
        """What :meth:`weigh` computes: ``"attention"`` or ``"routing"``; ``"none"`` for a tower
        without per-interest weights (YouTube DNN); ``"unavailable"`` for an artifact without
        the ``interest_weights`` endpoint (exported before it existed, or built in memory)."""
        kind = self.manifest.get("explanation")
        if kind == "none" or (kind in EXPLANATIONS and self.interest_weights is not None):
            return str(kind)
        return "unavailable"

    @property
    def similarity(self) -> str:
        """How the model scores an item (:func:`manifest_similarity`)."""
        return manifest_similarity(self.manifest)

    @property
    def max_len(self) -> int:
        return int(self.manifest["max_len"])

    @property
    def num_interests(self) -> int:
        return int(self.manifest["num_interests"])

    @property
    def dim(self) -> int:
        return int(self.item_embeddings.shape[1])

    def encode(
        self, histories: Sequence[np.ndarray], features: Features | None = None, width: int | None = None
    ) -> np.ndarray:
        """Dense-id histories (oldest first) -> interests float32 ``[B, K, d]``.

        Args:
            histories: per user, dense item ids.
            features: per side feature the tower reads, per user an int array aligned with
                the history (see ``retrieval.data.features.encode_events``); missing = unknown (0).
            width: columns of the tower's input, at most ``max_len`` (None = ``max_len``).
                Histories are cut to it: a batch of short histories may be encoded in fewer
                columns, with the same result (towers ignore padding), for less work.

        Each history is cut to its last ``width`` events and left-padded with 0.
        """
        return self.user_vectors(self.tower_inputs(histories, features, width))

    def weigh(
        self, histories: Sequence[np.ndarray], features: Features | None = None, width: int | None = None
    ) -> np.ndarray:
        """Per interest, the weight of each of the last ``width`` events (arguments as in
        :meth:`encode`): float32 ``[B, K, width]``, 0 at padding (each history is right-aligned).

        Raises:
            ValueError: the artifact has no interest weights (:attr:`explanation`).
        """
        if self.interest_weights is None:
            raise ValueError(f"model {self.version} has no interest weights ({self.explanation})")
        return self.interest_weights(self.tower_inputs(histories, features, width))

    def tower_inputs(
        self, histories: Sequence[np.ndarray], features: Features | None = None, width: int | None = None
    ) -> dict[str, np.ndarray]:
        """The user tower's inputs (arguments as in :meth:`encode`): int32 ``[B, width]`` each."""
        width = self.max_len if width is None else min(max(int(width), 1), self.max_len)
        inputs = {"items": pad_left(histories, width)}
        for name in self.side.event_features:
            given = (features or {}).get(name)
            inputs[name] = pad_left(given, width) if given is not None else np.zeros_like(inputs["items"])
        return inputs


def pad_left(histories: Sequence[np.ndarray], max_len: int) -> np.ndarray:
    """Keeps the last ``max_len`` ids of each history, left-padded with 0: int32 ``[B, max_len]``."""
    out = np.zeros((len(histories), max_len), np.int32)
    for row, h in zip(out, histories, strict=True):
        tail = np.asarray(h)[-max_len:]
        if len(tail):
            row[max_len - len(tail) :] = tail
    return out


def load_model(
    path: Path, verify: bool = True, xla: bool = False, reuse: ModelArtifact | None = None
) -> ModelArtifact:
    """Loads a model artifact written by ``tools/train.py`` (checksums verified by default).

    Nothing is read that the manifest does not list (so every byte read is covered by a
    checksum), and what is read must agree with the manifest before the model is returned:
    the vocabulary (unique string ids), the embeddings (``.npy`` without pickle, float32
    ``[num_items + 1, dim]``, finite; so are the attribute embeddings, when listed) and the
    user tower, which is called once on a probe
    history and must answer ``[1, num_interests, dim]`` finite vectors; the ``interest_weights``
    endpoint must be there exactly when the manifest's ``explanation`` says the tower has
    weights (a manifest without it, from before explanations, serves none). With ``xla`` the
    user tower runs compiled (:func:`compiled_tower`); the interest weights, computed only for
    the requests that ask, run as the plain graph.

    ``reuse``, a model loaded before (the version in service), lends its user tower when this
    folder's tower files are the very files it was loaded from (hard links of one training,
    as ``mitt add-items`` publishes): then nothing is read or verified twice. Catalogue
    changes (:mod:`retrieval.artifacts.changes`) are applied over the base files, or over
    ``reuse``'s catalogue when it shares them (:func:`load_catalogue`).

    Raises:
        retrieval.storage.manifest.ArtifactError: missing, incomplete, corrupted or inconsistent folder.
    """
    path = Path(path)
    shared = _shared_with(path, reuse)
    manifest = read_manifest(path, KIND, verify=verify, verified=shared)
    max_len, num_interests, dim, num_items = _manifest_sizes(path, manifest)
    listed = set(manifest.get("files", {}))
    for name in (VOCAB_FILE, EMBEDDINGS_FILE, f"{TOWER_DIR}/saved_model.pb"):
        _listed_file(path, listed, name)
    _refuse_unlisted(path, listed)
    side = _load_side(path)
    _check_against_config(path, manifest, side, listed)  # before the (slow) TensorFlow load
    attribute_embeddings = _attribute_embeddings(path, listed, side, dim)
    catalogue = load_catalogue(path, manifest, reuse, shared)
    _check_item_counts(path, manifest, num_items, len(catalogue.vocab))
    user_vectors, weights = _user_tower(path, manifest, xla, reuse, shared)
    model = ModelArtifact(
        path,
        manifest,
        catalogue.vocab,
        catalogue.embeddings,
        user_vectors,
        side,
        weights,
        attribute_embeddings,
        catalogue.removed,
        catalogue.changes,
        catalogue.grown_from,
    )
    _check_tower(model, num_interests, max_len)
    return model


def _manifest_sizes(path: Path, manifest: dict[str, Any]) -> tuple[int, int, int, int]:
    """The manifest's ``max_len``, ``num_interests``, ``dim`` and ``num_items``, each positive;
    refuses a manifest without a tower name."""
    max_len = _positive_int(path, manifest, "max_len")
    num_interests = _positive_int(path, manifest, "num_interests")
    dim = _positive_int(path, manifest, "dim")
    num_items = _positive_int(path, manifest, "num_items")
    if not isinstance(manifest.get("tower"), str) or not manifest["tower"]:
        raise ArtifactError(f"{path / MANIFEST}: tower must be a tower name, found {manifest.get('tower')!r}")
    return max_len, num_interests, dim, num_items


def _attribute_embeddings(path: Path, listed: set[str], side: SideVocab, dim: int) -> np.ndarray | None:
    """The item tower's attribute embeddings ``[attributes + 1, dim]``, when the manifest lists them."""
    if ATTRIBUTE_EMBEDDINGS_FILE not in listed:
        return None
    return load_vectors(path / ATTRIBUTE_EMBEDDINGS_FILE, len(side.attributes) + 1, dim)


def _user_tower(
    path: Path, manifest: dict[str, Any], xla: bool, reuse: ModelArtifact | None, shared: set[str]
) -> tuple[UserVectorsFn, InterestWeightsFn | None]:
    """``reuse``'s tower endpoints when this folder's tower files are the ones it was loaded from
    (``shared``), else the folder's own (:func:`_load_tower`)."""
    if reuse is not None and _tower_files(manifest) <= shared and _tower_files(manifest):
        return reuse.user_vectors, reuse.interest_weights
    return _load_tower(path, manifest, xla)


def _load_side(path: Path) -> SideVocab:
    """The side features the tower reads (``side_vocab.json``; none without it)."""
    if not (path / SIDE_FILE).is_file():
        return SideVocab()
    try:
        return SideVocab.load(path / SIDE_FILE)
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path / SIDE_FILE} is not a valid side-feature vocabulary: {e}") from e


def _check_item_counts(path: Path, manifest: dict[str, Any], num_items: int, catalogue_items: int) -> None:
    """Refuses a catalogue of another size than ``num_items``, or a ``tower_items`` (set to
    ``num_items`` when the manifest has none) outside the items the tower can know."""
    if num_items != catalogue_items:
        raise ArtifactError(
            f"{path}: the manifest says {num_items} items, the catalogue has {catalogue_items}"
        )
    tower_items = manifest.setdefault("tower_items", num_items)
    # Only a catalogue change (which names the version it changed) adds items the tower lacks.
    least = 1 if "previous_version" in manifest else num_items
    if (
        isinstance(tower_items, bool)
        or not isinstance(tower_items, int)
        or not least <= tower_items <= num_items
    ):
        raise ArtifactError(
            f"{path / MANIFEST}: tower_items must be in {least}..{num_items}, found {tower_items!r}"
        )


def _load_tower(
    path: Path, manifest: dict[str, Any], xla: bool
) -> tuple[UserVectorsFn, InterestWeightsFn | None]:
    """The SavedModel's endpoints: ``user_vectors`` (XLA-compiled with ``xla``) and
    ``interest_weights`` (None when the tower has none).

    Raises:
        ArtifactError: an unreadable SavedModel, or endpoints that contradict the manifest.
    """
    import tensorflow as tf

    try:
        exported = tf.saved_model.load(str(path / TOWER_DIR))
        if not hasattr(exported, "user_vectors"):
            raise ValueError("the SavedModel has no user_vectors endpoint")
    except Exception as e:  # TensorFlow raises many types for unreadable or foreign SavedModels
        raise ArtifactError(f"{path / TOWER_DIR} is not a readable user tower: {_first_line(e)}") from e
    table = None
    if TOWER_TABLE_FILE in manifest["files"]:
        rows, dim = int(manifest["tower_items"]) + 1, int(manifest["dim"])
        table = shared_tensor(load_vectors(path / TOWER_TABLE_FILE, rows, dim, mmap="c"))
    return tower_function(exported, table, xla), _interest_weights(path, manifest, exported, table)


def _refuse_unlisted(path: Path, listed: set[str]) -> None:
    """Refuses a tower file or an optional file the manifest does not list (added after writing)."""
    optional = [
        SIDE_FILE,
        ATTRIBUTES_FILE,
        ATTRIBUTE_EMBEDDINGS_FILE,
        REMOVED_FILE,
        CHANGES_FILE,
        CHANGE_VECTORS_FILE,
    ]
    unlisted = sorted(
        p.relative_to(path).as_posix()
        for p in [*(path / TOWER_DIR).rglob("*"), *(path / name for name in optional)]
        if (p.is_file() or p.is_symlink()) and p.relative_to(path).as_posix() not in listed
    )
    if unlisted:
        raise ArtifactError(
            f"{path}: {', '.join(unlisted)} not listed in the manifest (added after writing?)"
        )


class Catalogue(NamedTuple):
    """A model folder's catalogue, changes applied (:func:`load_catalogue`)."""

    vocab: ItemVocab
    embeddings: np.ndarray
    removed: np.ndarray
    changes: CatalogueChanges | None = None
    grown_from: str | None = None


def load_catalogue(
    path: Path, manifest: dict[str, Any], reuse: ModelArtifact | None = None, shared: set[str] | None = None
) -> Catalogue:
    """The vocabulary, the item table and the removed ids, catalogue changes applied. They are
    applied over ``reuse``'s catalogue instead of the base files when ``reuse`` was loaded from
    the same base files and its changes come first in these (:meth:`CatalogueChanges.extends`):
    the cost of a catalogue change is then its own size."""
    listed, dim = set(manifest["files"]), int(manifest["dim"])
    changes = CatalogueChanges.load(path, dim) if CHANGES_FILE in listed else None
    base = {VOCAB_FILE, EMBEDDINGS_FILE, REMOVED_FILE, ATTRIBUTES_FILE} & listed
    if (
        reuse is not None
        and changes is not None
        and base <= (shared or set())
        and changes.extends(reuse.changes or CatalogueChanges.none(dim))
    ):
        start = Catalogue(reuse.vocab, reuse.item_embeddings, reuse.removed, grown_from=reuse.version)
    else:
        vocab = load_vocab(path)
        table = load_vectors(path / EMBEDDINGS_FILE, len(vocab) + 1, dim, mmap="r")  # shared pages
        removed = _load_removed(path, vocab) if REMOVED_FILE in listed else np.zeros(0, np.int64)
        start = Catalogue(vocab, table, removed)
    if changes is None:
        return start
    vocab = grown_vocab(start.vocab, changes)
    dense, kept = vocab.lookup(changes.ids), ~changes.removed
    table = np.empty((len(vocab) + 1, dim), np.float32)  # one pass over the table, not two
    table[: len(start.embeddings)] = start.embeddings
    table[len(start.embeddings) :] = 0.0
    table[dense[changes.has_vector]] = changes.vectors[changes.has_vector]
    removed = np.union1d(np.setdiff1d(start.removed, dense[kept]), dense[changes.removed])
    return Catalogue(vocab, table, removed, changes, start.grown_from)


def _tower_files(manifest: dict[str, Any]) -> set[str]:
    """The files of the user tower's SavedModel."""
    return {name for name in manifest.get("files", {}) if name.startswith(f"{TOWER_DIR}/")}


def _shared_with(path: Path, reuse: ModelArtifact | None) -> set[str]:
    """The files of the model folder ``path`` that are those ``reuse`` was loaded from."""
    if reuse is None or reuse.path is None:
        return set()
    try:
        manifest = read_manifest(path, KIND, verify=False)
    except ArtifactError:
        return set()  # the full read below says what is wrong
    return same_files(path, manifest, reuse.path, reuse.manifest)


def _load_removed(path: Path, vocab: ItemVocab) -> np.ndarray:
    """The dense ids of ``removed_items.json`` (external ids of the vocabulary), sorted int64."""
    try:
        ids = json.loads((path / REMOVED_FILE).read_text(encoding="utf-8"))
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("not a list of item ids")
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path / REMOVED_FILE} is not a list of item ids: {e}") from e
    dense = vocab.lookup(ids)
    if (dense == PAD).any():
        raise ArtifactError(f"{path / REMOVED_FILE} names items the vocabulary does not have")
    return np.unique(dense)


def _interest_weights(
    path: Path, manifest: dict[str, Any], exported: Any, table: Any
) -> InterestWeightsFn | None:
    """The SavedModel's ``interest_weights`` endpoint, checked against the manifest's ``explanation``.

    Raises:
        ArtifactError: an unknown ``explanation``, or one that the endpoints contradict.
    """
    kind = manifest.get("explanation")
    has_endpoint = hasattr(exported, "interest_weights")
    if kind is not None and kind not in EXPLANATIONS:
        raise ArtifactError(f"{path / MANIFEST}: explanation must be one of {EXPLANATIONS}, found {kind!r}")
    if has_endpoint != (kind in ("attention", "routing")):
        endpoint = "has an" if has_endpoint else "has no"
        raise ArtifactError(
            f"{path / TOWER_DIR} {endpoint} interest_weights endpoint, the manifest's explanation is {kind!r}"
        )
    return _Endpoint(exported, "interest_weights", table) if has_endpoint else None


def read_model_vocab(path: Path, verify: bool = False) -> ItemVocab:
    """The item vocabulary of a model folder (ids and titles), without loading the model.

    Raises:
        retrieval.storage.ArtifactError: not a model folder, or an invalid vocabulary.
    """
    path = Path(path)
    manifest = read_manifest(path, KIND, verify=verify)
    vocab = load_vocab(path)
    if CHANGES_FILE in manifest.get("files", {}):
        vocab = grown_vocab(vocab, CatalogueChanges.load(path, int(manifest["dim"])))
    return vocab


def load_vocab(path: Path) -> ItemVocab:
    """The folder's ``vocab.json``, checked: unique string ids and string titles."""
    try:
        vocab = ItemVocab.load(path / VOCAB_FILE)
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path / VOCAB_FILE} is not a valid vocabulary: {e}") from e
    return vocab


def tower_function(exported: Any, table: Any = None, xla: bool = False) -> UserVectorsFn:
    """The SavedModel's ``user_vectors`` endpoint on numpy arrays, reading the item vectors
    ``table`` (None for a SavedModel that holds its own), XLA-compiled with ``xla``."""
    return compiled_tower(exported, table) if xla else _Endpoint(exported, "user_vectors", table)


class _Endpoint:
    """The SavedModel's endpoint ``name`` on numpy arrays (int32 inputs), called through its
    one traced graph when it has one: the restored function would match every call's
    arguments against its signatures first (``bench.floor``'s user-tower stage at batch 1)."""

    def __init__(self, exported: Any, name: str, table: Any = None) -> None:
        # Holds the loaded object itself: its endpoint alone does not keep the variables
        # alive, and TensorFlow frees them once the object is collected.
        self.exported = exported
        function = getattr(exported, name)
        traced = list(getattr(function, "concrete_functions", ()))
        self.call = traced[0] if len(traced) == 1 else function
        self.table = () if table is None else (table,)  # the item vectors it reads, if any

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        import tensorflow as tf

        return self.call({k: tf.constant(v, tf.int32) for k, v in inputs.items()}, *self.table).numpy()


def compiled_tower(exported: Any, table: Any = None) -> UserVectorsFn:
    """The SavedModel's ``user_vectors`` endpoint compiled by XLA (faster than the plain graph:
    ``bench/serving.py`` has a row with it), with a fallback to the plain graph should XLA
    refuse it (:class:`retrieval.artifacts.xla.XlaFunction`).

    XLA compiles once per input shape (0.3-1 s, on first use: :func:`retrieval.serving.reload.warm_up`
    does it before serving), so rows are padded to one of :data:`COMPILED_BATCHES`. Not the
    default: TensorFlow keeps every compiled program for the life of the process, so a server
    that hot-reloads grows by about 1 MB per version (the soak test's reload loop).
    """
    import tensorflow as tf

    read = () if table is None else (table,)  # the item vectors it reads, if any
    tower = XlaFunction(lambda inputs: exported.user_vectors(inputs, *read), what="this user tower")

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        rows = len(inputs["items"])
        size = padded_size(rows, COMPILED_BATCHES) or rows
        padded = {k: tf.constant(pad_to(v, (size, v.shape[1])), tf.int32) for k, v in inputs.items()}
        return tower(padded)[:rows]

    # The closure holds the loaded object itself: its endpoint alone does not keep the
    # variables alive, and TensorFlow frees them once the object is collected.
    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        chunk, rows = COMPILED_BATCHES[-1], len(inputs["items"])
        if rows <= chunk:
            return run(inputs)
        return np.concatenate(
            [run({k: v[i : i + chunk] for k, v in inputs.items()}) for i in range(0, rows, chunk)]
        )

    return user_vectors


VOCAB_FILE = "vocab.json"
CONFIG_FILE = "config.json"
EMBEDDINGS_FILE = "item_embeddings.npy"
DEFAULT_SIMILARITY = "dot"
"""The ``similarity`` of a model whose manifest does not say (written before cosine similarity)."""
TOWER_DIR = "user_tower"
TOWER_TABLE = "item_vectors.npy"
TOWER_TABLE_FILE = f"{TOWER_DIR}/{TOWER_TABLE}"
ATTRIBUTES_FILE = "item_attributes.json"
ATTRIBUTE_EMBEDDINGS_FILE = "attribute_embeddings.npy"
REMOVED_FILE = "removed_items.json"


def _positive_int(path: Path, manifest: dict[str, Any], key: str) -> int:
    value = manifest.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArtifactError(f"{path / MANIFEST}: {key} must be a positive integer, found {value!r}")
    return value


def _listed_file(path: Path, listed: set[str], name: str) -> Path:
    """``path / name``, which the manifest must list (so that a checksum covers it)."""
    if name not in listed:
        raise ArtifactError(f"{path} is incomplete: {name} is not listed in the manifest")
    return contained_file(path, name)


def manifest_similarity(manifest: dict[str, Any]) -> str:
    """How a model scores an item, from its manifest: ``"dot"`` or ``"cosine"`` (its
    ``item_embeddings`` and interests at unit length); a model from before cosine similarity is
    ``"dot"``."""
    return str(manifest.get("similarity", DEFAULT_SIMILARITY))


def _check_against_config(path: Path, manifest: dict[str, Any], side: SideVocab, listed: set[str]) -> None:
    """The manifest repeats what ``config.json`` and the side vocabulary say (tower, sizes, data,
    inputs); both are checksummed, so a manifest field that disagrees was damaged."""
    pairs: list[tuple[str, Any, Any]] = [
        ("inputs", manifest.get("inputs"), ["items", *side.event_features]),
        ("side_features", manifest.get("side_features"), list(side.features)),
    ]
    if CONFIG_FILE in listed:
        try:
            config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
            section, data = dict(config["model"]), dict(config["data"])
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ArtifactError(f"{path / CONFIG_FILE} is not a valid configuration: {e}") from e
        defaults = {"similarity": DEFAULT_SIMILARITY}  # a model from before cosine similarity
        keys = ("tower", "max_len", "fusion", "similarity")
        pairs += [(key, manifest.get(key), section.get(key, defaults.get(key))) for key in keys]
        pairs += [
            ("dim", manifest.get("dim"), section.get("dim")),
            ("data", manifest.get("data"), data.get("path")),
        ]
        if section.get("num_interests") is not None:
            pairs.append(("num_interests", manifest.get("num_interests"), section["num_interests"]))
    for key, in_manifest, expected in pairs:
        if key in manifest and in_manifest != expected:
            raise ArtifactError(
                f"{path / MANIFEST}: {key} is {in_manifest!r}, the artifact's files say {expected!r}"
            )


def _check_tower(model: ModelArtifact, num_interests: int, max_len: int) -> None:
    """Calls the tower on a one-item history; it must answer finite ``[1, num_interests, dim]``."""
    probe = [np.array([1 if len(model.vocab) else 0], np.int64)]
    try:
        out = np.asarray(model.encode(probe))
    except Exception as e:  # a signature that does not fit the manifest fails inside TensorFlow
        raise ArtifactError(
            f"{model.path}: the user tower does not take a [1, {max_len}] history as "
            f"{{'items': int32, ...}} (exported by another version of the code?): {_first_line(e)}"
        ) from e
    if out.shape != (1, num_interests, model.dim) or not np.isfinite(out).all():
        raise ArtifactError(
            f"{model.path}: the user tower answers {list(out.shape)}, the manifest and embeddings "
            f"say [1, {num_interests}, {model.dim}] finite vectors"
        )
    if model.interest_weights is not None:
        weights = np.asarray(model.weigh(probe))
        if weights.shape != (1, num_interests, max_len) or not np.isfinite(weights).all():
            raise ArtifactError(
                f"{model.path}: the interest weights are {list(weights.shape)}, "
                f"expected [1, {num_interests}, {max_len}] finite values"
            )


def _first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (TensorFlow's messages run to pages)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


def encode_histories(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    features: Features | None = None,
    batch_size: int = 1024,
) -> np.ndarray:
    """Interests for every history, float32 ``[U, K, d]`` (``features`` as in
    :meth:`ModelArtifact.encode`).

    Histories are encoded in batches of similar lengths, each only as wide as its longest
    history (rounded up to a multiple of 8): the towers ignore padding, so the result is that
    of full-width batches, for a fraction of the work on short histories.
    """
    out = np.zeros((len(histories), model.num_interests, model.dim), np.float32)
    lengths = np.array([min(len(h), model.max_len) for h in histories], np.int64)
    order = np.argsort(lengths, kind="stable")
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        width = -(-max(int(lengths[rows].max()), 1) // 8) * 8
        part = None if features is None else {k: [v[r] for r in rows] for k, v in features.items()}
        out[rows] = model.encode([histories[r] for r in rows], part, width=width)
    return out


def data_options(model_dir: Path | None) -> dict[str, Any]:
    """How a model's training read its table (``columns``, ``timestamp_unit``, from the model
    folder's ``config.json``), to read other data of the same shape alike; the defaults for a
    model in memory (``None``) or a folder written before the options existed.

    Example:
        >>> load_interactions(path, format, **data_options(model.path))
    """
    path = None if model_dir is None else Path(model_dir) / CONFIG_FILE
    data = json.loads(path.read_text(encoding="utf-8")).get("data", {}) if path and path.is_file() else {}
    return {"columns": dict(data.get("columns") or {}), "timestamp_unit": data.get("timestamp_unit", "s")}


def read_item_attributes(model_dir: Path) -> dict[str, list[str]] | None:
    """A model folder's ``item_attributes.json`` (external id -> attributes), catalogue changes
    applied; ``None`` without one."""
    path = Path(model_dir) / ATTRIBUTES_FILE
    if not path.is_file():
        return None
    attributes = json.loads(path.read_text(encoding="utf-8"))
    if (Path(model_dir) / CHANGES_FILE).is_file():
        manifest = read_manifest(Path(model_dir), KIND, verify=False)
        attributes = changed_attributes(
            attributes, CatalogueChanges.load(Path(model_dir), int(manifest["dim"]))
        )
    return attributes
