"""Readers of a prepared folder: its vocabulary, counts and side features, its row groups one at a
time, and its evaluation users a batch at a time (the layout: :mod:`retrieval.data.prepared`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from retrieval.data.features import SideVocab, action_column, build_side_vocab, encode_events
from retrieval.data.interactions import SequenceData
from retrieval.data.vocab import ItemVocab
from retrieval.storage.manifest import FORMAT_VERSION, MANIFEST, ArtifactError

KIND = "prepared-data"
VOCAB_FILE = "vocab.json"
ATTRIBUTES_FILE = "item_attributes.json"
COUNTS_FILE = "item_counts.parquet"
SEQUENCES = "sequences"
SPLITS = ("valid", "test")
SPLIT_COLUMNS = ("train_len", "valid_target", "test_target")

RESERVED_COLUMNS = ("user", "items", *SPLIT_COLUMNS)
"""Layout columns: an input event column may not have one of these names."""


def resolve(path: str | Path, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """A path or URI -> (Arrow file system, path inside it); a given ``filesystem`` is used as is."""
    if filesystem is not None:
        return filesystem, str(path)
    text = str(path)
    if "://" in text:
        fs, inner = pafs.FileSystem.from_uri(text)
        return fs, inner
    return pafs.LocalFileSystem(), str(Path(text).resolve())


@dataclass(frozen=True)
class Prepared:
    """An opened prepared folder.

    Attributes:
        filesystem: the Arrow file system holding it.
        root: its path inside ``filesystem``.
        meta: the manifest (see the module docstring).
        files: the partition files, in partition order.
    """

    filesystem: pafs.FileSystem
    root: str
    meta: dict[str, Any]
    files: tuple[str, ...]

    def path(self, name: str) -> str:
        """Where the folder's file ``name`` (e.g. ``vocab.json``) is in :attr:`filesystem`."""
        return f"{self.root}/{name}" if self.root else name

    def read_bytes(self, name: str) -> bytes:
        """The bytes of the folder's file ``name``."""
        with self.filesystem.open_input_stream(self.path(name)) as f:
            return bytes(f.read())

    @property
    def event_columns(self) -> tuple[str, ...]:
        """The per-event list columns besides ``items`` (``timestamp`` first)."""
        return tuple(self.meta["event_columns"])


def open_prepared(folder: str | Path | Prepared, filesystem: pafs.FileSystem | None = None) -> Prepared:
    """Opens a prepared folder: a local path, a URI (``s3://bucket/prepared``) or a path in ``filesystem``.

    Raises:
        ArtifactError: not a prepared folder (no or another manifest), or a partition file missing.
    """
    if isinstance(folder, Prepared):
        return folder
    fs, root = resolve(folder, filesystem)
    root = root.rstrip("/")
    where = Prepared(fs, root, {}, ())
    try:
        manifest = json.loads(where.read_bytes(MANIFEST))
    except FileNotFoundError:
        raise ArtifactError(f"{folder} is not a {KIND} folder: {MANIFEST} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{folder}/{MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        found = manifest.get("kind") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{folder} holds a {found!r} artifact, expected {KIND!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{folder}: format version {manifest.get('format_version')!r} is not {FORMAT_VERSION}"
        )
    files = tuple(where.path(f"{SEQUENCES}/part-{p:05d}.parquet") for p in range(int(manifest["partitions"])))
    missing = [
        f
        for f, info in zip(files, fs.get_file_info(list(files)), strict=True)
        if info.type != pafs.FileType.File
    ]
    if missing:
        raise ArtifactError(f"{folder} is incomplete: {missing[0]} is missing")
    return Prepared(fs, root, manifest, files)


def is_prepared(path: str | Path) -> bool:
    """Whether ``path`` (a local path or a URI) is a prepared folder: its manifest's kind is
    :data:`KIND` (what format detection asks; :func:`open_prepared` checks the rest)."""
    try:
        fs, root = resolve(path)
        with fs.open_input_stream(f"{root.rstrip('/')}/{MANIFEST}") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError):  # no such file, not a folder, not JSON, not a URI Arrow reads
        return False
    return isinstance(manifest, dict) and manifest.get("kind") == KIND


def read_vocab(folder: str | Path | Prepared) -> ItemVocab:
    """The prepared folder's item vocabulary (``vocab.json``, :meth:`ItemVocab.save`'s format)."""
    payload = json.loads(open_prepared(folder).read_bytes(VOCAB_FILE))
    titles = payload.get("titles")
    return ItemVocab(tuple(payload["ids"]), None if titles is None else tuple(titles))


def read_item_attributes(folder: str | Path | Prepared) -> dict[str, list[str]] | None:
    """External item id -> attributes, or None when the data has none."""
    prepared = open_prepared(folder)
    try:
        payload: dict[str, list[str]] = json.loads(prepared.read_bytes(ATTRIBUTES_FILE))
    except FileNotFoundError:
        return None
    return payload


def item_counts(folder: str | Path | Prepared, which: str = "train") -> np.ndarray:
    """Per dense id, int64 ``[num_embeddings]``: ``events``, ``train`` (events in the training
    sequences, what the candidate sampler counts) or ``first``."""
    prepared = open_prepared(folder)
    table = pq.read_table(prepared.path(COUNTS_FILE), filesystem=prepared.filesystem, columns=[which])
    return np.asarray(table[which].to_numpy(), np.int64)


def target_counts(folder: str | Path | Prepared, objective: str) -> np.ndarray:
    """How often each dense id is a training target under ``objective``, int64 ``[num_embeddings]``.

    ``last`` and ``all_positions`` target every training event but each user's first once,
    ``cloze`` every training event (before masking), so no pass over the examples is needed;
    ``counts / counts.sum()`` is :func:`retrieval.training.inputs.target_probabilities` of the targets.
    """
    counts = item_counts(folder, "train")
    if objective in ("last", "all_positions"):
        return counts - item_counts(folder, "first")
    if objective == "cloze":
        return counts
    raise ValueError(f"unknown objective {objective!r}")


def count_examples(folder: str | Path | Prepared, objective: str, max_len: int) -> int:
    """Training examples one epoch of :func:`retrieval.training.examples.make_examples` gives (reads
    one column).

    Per training sequence of ``n`` events: ``last`` n - 1; ``all_positions`` a window of
    ``max_len`` targets ending at the last event and every ``max_len`` back while >= 2 events
    remain, ``(n - 2) // max_len + 1``; ``cloze`` the same down to 1 event, ``(n - 1) // max_len + 1``.
    """
    least = {"last": None, "all_positions": 2, "cloze": 1}
    if objective not in least:
        raise ValueError(f"unknown objective {objective!r}")
    total = 0
    for table in iter_pieces(folder, ["train_len"]):
        n = table["train_len"].to_numpy().astype(np.int64)
        low = least[objective]
        if low is None:
            total += int(np.maximum(n - 1, 0).sum())
        else:
            total += int(np.where(n >= low, (n - low) // max_len + 1, 0).sum())
    return total


def _read_piece(fragment: ds.Fragment, columns: Sequence[str]) -> pa.Table:
    """One row group's columns (the unit of memory of every reader; tests count these calls)."""
    return fragment.to_table(columns=list(columns))


def iter_pieces(
    folder: str | Path | Prepared, columns: Sequence[str], rng: np.random.Generator | None = None
) -> Iterator[pa.Table]:
    """Every row group of every partition file, one at a time (``columns`` only): in file order,
    or in a random order drawn from ``rng``."""
    prepared = open_prepared(folder)
    dataset = ds.dataset(list(prepared.files), filesystem=prepared.filesystem, format="parquet")
    pieces = [piece for fragment in dataset.get_fragments() for piece in fragment.split_by_row_group()]
    order = rng.permutation(len(pieces)) if rng is not None else range(len(pieces))
    for i in order:
        yield _read_piece(pieces[i], columns)


def _lists(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column -> (flat values, offsets ``[U + 1]``)."""
    column = table[name].combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy() - column.offsets[0].as_py()
    return flat, offsets


def user_sequences(table: pa.Table) -> list[np.ndarray]:
    """A piece's ``items`` column -> per user, int64 ``[len]`` dense ids."""
    flat, offsets = _lists(table, "items")
    flat = flat.astype(np.int64)
    return [flat[a:b] for a, b in itertools.pairwise(offsets)]


def side_columns(side: SideVocab | None, event_columns: Sequence[str]) -> list[str]:
    """The event columns the encoding of ``side``'s per-event features reads."""
    if side is None or not side.event_features:
        return []
    needed = []
    if "gap_prev" in side.event_features:
        needed.append("timestamp")
    column = action_column(list(event_columns))
    if "action" in side.event_features and column is not None:
        needed.append(column)
    return needed


def encode_side(table: pa.Table, side: SideVocab | None) -> dict[str, list[np.ndarray]]:
    """Per-event side inputs of a piece's users, ``{name: per user int32 [len]}``
    (:func:`retrieval.data.features.encode_events` of each whole sequence)."""
    if side is None or not side.event_features:
        return {}
    names = table.column_names
    column = action_column([n for n in names if n not in RESERVED_COLUMNS])
    times = _lists(table, "timestamp") if "timestamp" in names else None
    actions = _lists(table, column) if column is not None else None
    out: dict[str, list[np.ndarray]] = {name: [] for name in side.event_features}
    for u in range(table.num_rows):
        t = None if times is None else times[0][times[1][u] : times[1][u + 1]]
        a = None if actions is None else [str(v) for v in actions[0][actions[1][u] : actions[1][u + 1]]]
        for name, values in encode_events(side, t, a).items():
            out[name].append(values)
    return out


def side_vocab(folder: str | Path | Prepared, features: Sequence[str]) -> SideVocab:
    """:func:`retrieval.data.features.build_side_vocab` of a prepared folder (one pass over the action
    column when ``action`` is asked for).

    Raises:
        ValueError: the data lacks what a feature needs.
    """
    prepared = open_prepared(folder)
    columns = list(prepared.event_columns)
    column = action_column(columns)
    values: dict[str, tuple[np.ndarray, ...]] = {c: () for c in columns}
    if "action" in features and column is not None:
        seen: set[str] = set()
        for table in iter_pieces(prepared, [column]):
            seen |= {str(v) for v in pc.unique(pc.list_flatten(table[column])).to_pylist()}
        values[column] = (np.array(sorted(seen), dtype=object),)
    attributes = None
    external = read_item_attributes(prepared) if "attributes" in features else None
    if external:
        vocab = read_vocab(prepared)
        dense = vocab.lookup(list(external))
        attributes = {int(i): tuple(a) for i, a in zip(dense, external.values(), strict=True) if i}
    # build_side_vocab reads only these fields: the vocabularies come out exactly as in memory.
    summary = SequenceData(
        ItemVocab(()), (), (), attributes, values, bool(prepared.meta.get("has_time", True))
    )
    return build_side_vocab(summary, features)


@dataclass(frozen=True)
class EvalBatch:
    """Evaluation users of one split, a batch at a time (:class:`~retrieval.data.splits.LeaveOneOut` rows).

    Attributes:
        users: external user ids ``[B]``.
        histories: per user, int64 dense ids (the whole history, oldest first).
        targets: int64 ``[B]``.
        features: side inputs per user cut to the history (empty without side features).
    """

    users: tuple[str, ...]
    histories: tuple[np.ndarray, ...]
    targets: np.ndarray
    features: dict[str, list[np.ndarray]]


def iter_eval_batches(
    folder: str | Path | Prepared, split: str, batch_size: int = 1024, side: SideVocab | None = None
) -> Iterator[EvalBatch]:
    """The ``valid`` or ``test`` users (``len >= 3``) in batches of ``batch_size``, in file order;
    memory: one row group and one batch.

    Metrics averaged over users combine across batches weighted by ``len(batch.targets)``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    prepared = open_prepared(folder)
    back = 2 if split == "valid" else 1
    columns = ["user", "items", *side_columns(side, prepared.event_columns)]
    pending: list[EvalBatch] = []
    size = 0
    for table in iter_pieces(prepared, columns):
        sequences = user_sequences(table)
        keep = [u for u, s in enumerate(sequences) if len(s) >= 3]
        if not keep:
            continue
        encoded = encode_side(table, side)
        users = table["user"].to_pylist()
        histories = tuple(sequences[u][:-back] for u in keep)
        pending.append(
            EvalBatch(
                tuple(users[u] for u in keep),
                histories,
                np.array([sequences[u][-back] for u in keep], np.int64),
                {
                    n: [v[u][: len(h)] for u, h in zip(keep, histories, strict=True)]
                    for n, v in encoded.items()
                },
            )
        )
        size += len(keep)
        while size >= batch_size:
            batch, pending = _cut(pending, batch_size)
            size -= batch_size
            yield batch
    if size:
        yield _cut(pending, size)[0]


def _cut(pending: list[EvalBatch], n: int) -> tuple[EvalBatch, list[EvalBatch]]:
    """The first ``n`` users of the pending batches, and what is left."""
    merged = EvalBatch(
        tuple(u for b in pending for u in b.users),
        tuple(h for b in pending for h in b.histories),
        np.concatenate([b.targets for b in pending]),
        {name: [v for b in pending for v in b.features[name]] for name in pending[0].features},
    )
    head = EvalBatch(
        merged.users[:n],
        merged.histories[:n],
        merged.targets[:n],
        {k: v[:n] for k, v in merged.features.items()},
    )
    rest = EvalBatch(
        merged.users[n:],
        merged.histories[n:],
        merged.targets[n:],
        {k: v[n:] for k, v in merged.features.items()},
    )
    return head, [rest] if rest.users else []
