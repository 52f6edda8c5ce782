"""Evaluation of a model under the three protocols of :mod:`retrieval.protocols`.

Full ranking is exact (brute force) or through an index; sampled ranking scores the target and
its negatives directly. Also the popularity baseline, and the comparison of runs' metrics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from index import VectorIndex
from retrieval.data import Interactions, build_sequences, leave_one_out, load_interactions
from retrieval.features import history_features, user_event_features
from retrieval.metrics import (
    COMIREC_KS,
    DEFAULT_KS,
    SAMPLED_KS,
    comirec_metrics,
    diversity_at_k,
    ranking_metrics,
    sampled_metrics,
)
from retrieval.model_artifact import Features, ModelArtifact
from retrieval.protocols import DEFAULT_SEED, PROTOCOLS, comirec_split, sample_negatives
from retrieval.search import search_interests
from retrieval.vocab import PAD

_USER_BATCH = 256


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


def _top_k_rows(scores: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """Masks padding (column 0) and each row's excluded ids, then returns the top-k ids per row.

    Slots that no retrievable item fills hold -1.
    """
    scores[:, 0] = -np.inf
    for row, ids in zip(scores, exclude, strict=True):
        row[ids] = -np.inf
    n = min(k, scores.shape[1] - 1)
    part = np.argpartition(scores, -n, axis=1)[:, -n:]  # the n largest (no negated copy)
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-part_scores, axis=1, kind="stable")
    top = np.take_along_axis(part, order, axis=1)
    top[np.take_along_axis(part_scores, order, axis=1) == -np.inf] = -1  # excluded, not retrievable
    return np.pad(top, ((0, 0), (0, k - n)), constant_values=-1)  # a catalogue smaller than k


def exact_top_k(
    interests: np.ndarray, item_embeddings: np.ndarray, exclude: Sequence[np.ndarray], k: int
) -> np.ndarray:
    """Brute-force multi-interest retrieval, the oracle for every index.

    Args:
        interests: ``[U, K, d]``.
        item_embeddings: ``[V, d]`` (row 0 = padding, never returned).
        exclude: per user, dense ids never to return (their history).
        k: list length.

    Returns:
        int64 ``[U, k]``: items by their best score over the K interests, best first. All-zero
        (masked) interests are skipped, as the search does.
    """

    def scores(rows: slice) -> np.ndarray:
        block = interests[rows]  # [u, K, d]
        # One BLAS matmul (numpy's einsum does not use BLAS for this contraction: ~15x slower).
        per_interest = (block.reshape(-1, block.shape[2]) @ item_embeddings.T).reshape(
            block.shape[0], block.shape[1], -1
        )  # [u, K, V]
        masked = ~np.any(block != 0, axis=2)  # [u, K]
        per_interest[masked] = -np.inf
        return per_interest.max(axis=1)

    return _batched_top_k(scores, exclude, k)


def popularity_top_k(counts: np.ndarray, exclude: Sequence[np.ndarray], k: int) -> np.ndarray:
    """The most-popular baseline: items by training count, each user's history excluded."""
    counts = np.asarray(counts, np.float64)
    return _batched_top_k(lambda rows: np.tile(counts, (len(exclude[rows]), 1)), exclude, k)


def _batched_top_k(
    scores_for: Callable[[slice], np.ndarray], exclude: Sequence[np.ndarray], k: int
) -> np.ndarray:
    """Top-k ids for every user, computing the ``[b, V]`` scores of ``_USER_BATCH`` users at a time."""
    out = [
        _top_k_rows(scores_for(rows), exclude[rows], k)
        for rows in (slice(i, i + _USER_BATCH) for i in range(0, len(exclude), _USER_BATCH))
    ]
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, k), np.int64)


@dataclass(frozen=True)
class ProtocolResult:
    """One protocol's metrics on one split of a dataset.

    Attributes:
        protocol: one of ``retrieval.protocols.PROTOCOLS``.
        split: ``"valid"`` or ``"test"``.
        metrics: metric name -> mean over the evaluated users.
        users: users evaluated.
        settings: what else fixes the numbers (seed, negatives, the user split's sizes).
    """

    protocol: str
    split: str
    metrics: dict[str, float]
    users: int
    settings: dict[str, Any] = field(default_factory=dict)

    def record(self, **context: Any) -> dict[str, Any]:
        """A flat JSON-able record: ``context`` (model, data, search...), the protocol, split,
        users, settings and every metric; what ``tools/evaluate.py`` prints and saves."""
        return {
            **context,
            "protocol": self.protocol,
            "split": self.split,
            "users": self.users,
            **self.settings,
            **self.metrics,
        }


def full_ranking_top_k(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    k: int,
    features: Features | None = None,
    index: VectorIndex | None = None,
) -> np.ndarray:
    """Each user's top-``k`` over the whole catalogue, history excluded, interests max-merged.

    Exact search (the oracle), or the multi-interest search of ``index`` when one is given.

    Returns:
        int64 ``[U, k]``, best first, -1 where no item is left.
    """
    interests = encode_histories(model, histories, features)
    if index is None:
        return exact_top_k(interests, model.item_embeddings, histories, k)
    return search_interests(index, interests, k, exclude=[set(h.tolist()) for h in histories]).ids


def evaluate_ranking(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: np.ndarray,
    ks: Sequence[int] = DEFAULT_KS,
    features: Features | None = None,
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """Full-ranking metrics (:func:`~retrieval.metrics.ranking_metrics`), each user's history
    items excluded: exact search (the oracle), or the multi-interest search of ``index``
    (possibly approximate) when one is given."""
    return ranking_metrics(full_ranking_top_k(model, histories, max(ks), features, index), targets, ks)


def candidate_scores(
    interests: np.ndarray, item_embeddings: np.ndarray, candidates: np.ndarray, batch: int = _USER_BATCH
) -> np.ndarray:
    """Each candidate's best inner product over the user's interests.

    Args:
        interests: ``[U, K, d]``; all-zero (masked) interests are skipped.
        item_embeddings: ``[V, d]``.
        candidates: int ``[U, C]`` item ids; padding (0) scores ``-inf``.
        batch: users scored at once.

    Returns:
        float32 ``[U, C]``.
    """
    out = np.empty(candidates.shape, np.float32)
    for start in range(0, len(candidates), batch):
        rows = slice(start, start + batch)
        per_interest = np.matmul(interests[rows], item_embeddings[candidates[rows]].transpose(0, 2, 1))
        per_interest[~np.any(interests[rows] != 0, axis=2)] = -np.inf  # masked interests
        best = per_interest.max(axis=1)  # [u, C]
        best[candidates[rows] == PAD] = -np.inf
        out[rows] = best
    return out


def evaluate_sampled(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: np.ndarray,
    negatives: np.ndarray,
    features: Features | None = None,
    ks: Sequence[int] = SAMPLED_KS,
) -> dict[str, float]:
    """Sampled-ranking metrics: each target against its user's negatives (SASRec's protocol).

    Args:
        model: the model; every candidate is scored exactly (best interest).
        histories: per user, dense ids, oldest first.
        targets: int ``[U]``, the held-out items (0 = unknown to the model: a miss).
        negatives: int ``[U, n]``, e.g. from :func:`retrieval.protocols.sample_negatives`.
        features: side inputs aligned with ``histories``.
        ks: cut-offs.

    Returns:
        ``{"sampled_hr@10": …, "sampled_ndcg@10": …}``, see :func:`~retrieval.metrics.sampled_metrics`.
    """
    interests = encode_histories(model, histories, features)
    candidates = np.concatenate([np.asarray(targets, np.int64)[:, None], negatives], axis=1)  # [U, 1 + n]
    return sampled_metrics(candidate_scores(interests, model.item_embeddings, candidates), ks)


def evaluate_comirec(
    model: ModelArtifact,
    histories: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    features: Features | None = None,
    categories: np.ndarray | None = None,
    ks: Sequence[int] = COMIREC_KS,
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """ComiRec's metrics: top-N over the catalogue (history excluded, max-score merge over the
    interests), then Recall, HitRate, NDCG and, with ``categories``, diversity at each N.

    Args:
        model: the model.
        histories: per user, dense ids, oldest first (the first 80% of the sequence).
        targets: per user, int ``[m]`` held-out items (0 = unknown to the model: a miss).
        features: side inputs aligned with ``histories``.
        categories: int ``[V]`` category code per item (:func:`category_codes`); ``None``
            leaves diversity out.
        ks: the N values.
        index: search through this index instead of exactly.
    """
    top = full_ranking_top_k(model, histories, max(ks), features, index)
    metrics = comirec_metrics(top, targets, ks)
    if categories is not None:
        metrics.update(diversity_at_k(top, categories, ks))
    return metrics


def category_codes(first_attributes: Mapping[int, str], num_embeddings: int) -> np.ndarray:
    """Category code per item id, for :func:`~retrieval.metrics.diversity_at_k`.

    Args:
        first_attributes: item id -> its category (ComiRec: one category per item; here the
            item's first attribute).
        num_embeddings: ids run ``0..num_embeddings - 1``.

    Returns:
        int64 ``[num_embeddings]``: items of one category share a code; every item without
        a category has a code of its own (it differs from every other item).
    """
    names = {name: code for code, name in enumerate(dict.fromkeys(first_attributes.values()))}
    codes = np.arange(num_embeddings, dtype=np.int64) + len(names)
    for item, name in first_attributes.items():
        codes[item] = names[name]
    return codes


def _model_categories(interactions: Interactions, model: ModelArtifact) -> np.ndarray | None:
    """Every item's first attribute in the data (items without events too), as codes over the
    model's ids; ``None`` when the data has no attributes."""
    items = interactions.items
    if "attributes" not in items.columns:
        return None
    dense = model.vocab.lookup(items["item"].astype(str).tolist())
    first = {
        int(d): str(values[0])
        for d, values in zip(dense, items["attributes"], strict=True)
        if d != PAD and values is not None and len(values)
    }
    return category_codes(first, len(model.item_embeddings))


def _model_histories(
    to_model: np.ndarray,
    per_user: Mapping[str, Sequence[np.ndarray]],
    users: np.ndarray,
    histories: Sequence[np.ndarray],
) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
    """Data-id histories (prefixes of the users' sequences) -> model ids, items the model does
    not know dropped, with each side feature cut and filtered alike."""
    raw = [to_model[h] for h in histories]
    known = [h != PAD for h in raw]
    cut = history_features(per_user, users, [len(h) for h in histories])
    features = {name: [v[k] for v, k in zip(values, known, strict=True)] for name, values in cut.items()}
    return [h[k] for h, k in zip(raw, known, strict=True)], features


def evaluate_protocol(
    model: ModelArtifact,
    data_path: str | Path,
    protocol: str = "loo-full",
    data_format: str | None = None,
    split: str = "test",
    index: VectorIndex | None = None,
    *,
    seed: int = DEFAULT_SEED,
    num_negatives: int = 100,
) -> ProtocolResult:
    """A trained model's metrics on a dataset under one protocol (:mod:`retrieval.protocols`).

    The data is split as the protocol says and its item ids are mapped through the model's
    vocabulary: history items the model does not know are dropped, unknown targets count
    as misses.

    * ``loo-full``: leave-one-out, full ranking, history excluded: ``hr``, ``ndcg``, ``recall``
      at 5, 10, 20, 50 (exact, or through ``index``).
    * ``loo-sampled``: leave-one-out, the target against ``num_negatives`` items the user
      never interacted with (drawn with ``seed``): ``sampled_hr@10``, ``sampled_ndcg@10``.
    * ``comirec``: ComiRec's user split (``seed``), history = first 80%, targets = the rest:
      ``recall``, ``hitrate``, ``ndcg`` (ComiRec's definitions) and, when the data has item
      attributes, ``diversity`` (categories = first attribute), at 20 and 50.

    Raises:
        ValueError: unknown protocol or split, ``index`` with ``loo-sampled``, or too few
            items to sample negatives from.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    if protocol == "loo-sampled" and index is not None:
        raise ValueError("loo-sampled scores the target and its negatives exactly: an index does not apply")
    interactions = load_interactions(data_path, data_format)
    data = build_sequences(interactions)
    to_model = np.concatenate([[PAD], model.vocab.lookup(list(data.vocab.ids))])  # data id -> model id
    per_user = user_event_features(data, model.side)  # encoded with the model's vocabularies
    test = split == "test"

    if protocol == "comirec":
        parts = comirec_split(data.sequences, seed)
        users = parts.test_users if test else parts.valid_users
        histories, features = _model_histories(
            to_model, per_user, users, parts.test_histories if test else parts.valid_histories
        )
        targets = [to_model[t] for t in (parts.test_targets if test else parts.valid_targets)]
        categories = _model_categories(interactions, model)
        metrics = evaluate_comirec(model, histories, targets, features, categories, index=index)
        settings = {
            "seed": seed,
            "train_users": len(parts.train_users),
            "valid_users": len(parts.valid_users),
            "test_users": len(parts.test_users),
            "dropped_users": len(parts.dropped_users),
        }
        return ProtocolResult(protocol, split, metrics, len(users), settings)

    loo = leave_one_out(data)
    users = loo.test_users if test else loo.valid_users
    histories, features = _model_histories(
        to_model, per_user, users, loo.test_histories if test else loo.valid_histories
    )
    targets = to_model[loo.test_targets if test else loo.valid_targets]
    if protocol == "loo-full":
        metrics = evaluate_ranking(model, histories, targets, features=features, index=index)
        return ProtocolResult(protocol, split, metrics, len(users))
    # Everything the user ever touched (the validation and test items too) stays out of the negatives.
    user_items = [to_model[data.sequences[u]] for u in users]
    negatives = sample_negatives(user_items, len(model.vocab), num_negatives, seed)
    metrics = evaluate_sampled(model, histories, targets, negatives, features)
    return ProtocolResult(protocol, split, metrics, len(users), {"seed": seed, "negatives": num_negatives})


def evaluate_model_on_data(
    model: ModelArtifact,
    data_path: str | Path,
    data_format: str | None = None,
    split: str = "test",
    index: VectorIndex | None = None,
) -> dict[str, float]:
    """Leave-one-out full-ranking metrics of a trained model on a dataset (exact, or through
    ``index``): :func:`evaluate_protocol` with ``loo-full``."""
    return evaluate_protocol(model, data_path, "loo-full", data_format, split, index).metrics


METRICS_FILE = "metrics.json"
_METRIC_KEY = re.compile(r"^([a-z_]+)@(\d+)$")


def load_run_rows(path: str | Path) -> list[dict[str, Any]]:
    """The comparison rows of one run: a folder holding ``metrics.json``, or a metrics JSON file.

    Reads both what ``tools/evaluate.py --out`` writes (one row) and a model artifact's
    training metrics (its ``test`` metrics, plus a row for its popularity baseline).

    Returns:
        rows ``{"run": str(path), "protocol", "split", "<metric>@<K>": value, ...}``.

    Raises:
        ValueError: the file is missing, not JSON, or holds neither kind of metrics.
    """
    path = Path(path)
    file = path / METRICS_FILE if path.is_dir() else path
    try:
        payload = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read run metrics: {e}") from None

    def metrics_of(values: Mapping[str, Any]) -> dict[str, float]:
        return {
            k: float(v)
            for k, v in values.items()
            if _METRIC_KEY.match(k) and isinstance(v, int | float) and not isinstance(v, bool)
        }

    name = str(path)
    if isinstance(payload, dict) and "protocol" in payload and "split" in payload:  # tools/evaluate.py
        return [
            {"run": name, "protocol": payload["protocol"], "split": payload["split"], **metrics_of(payload)}
        ]
    if isinstance(payload, dict) and isinstance(payload.get("test"), dict):  # tools/train.py
        protocol = str(payload.get("protocol", "loo-full"))
        rows = [{"run": name, "protocol": protocol, "split": "test", **metrics_of(payload["test"])}]
        if isinstance(payload.get("baseline_popularity_test"), dict):
            baseline = metrics_of(payload["baseline_popularity_test"])
            rows.append({"run": f"{name} (most popular)", "protocol": protocol, "split": "test", **baseline})
        return rows
    raise ValueError(f"{file}: holds neither tools/evaluate.py nor tools/train.py metrics")


def markdown_table(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """A Markdown table of runs (rows of :func:`load_run_rows` or :meth:`ProtocolResult.record`).

    Args:
        rows: one per run, with ``run``, ``protocol``, ``split`` and ``<metric>@<K>`` values.
        metrics: the metric columns, in order; default every metric of any row, grouped by
            metric in order of first appearance, each by ascending K. A run without a
            metric shows ``–``.
    """
    if metrics is None:
        families: dict[str, None] = {}
        keys: set[str] = set()
        for row in rows:
            for key in row:
                if match := _METRIC_KEY.match(key):
                    families.setdefault(match.group(1))
                    keys.add(key)
        order = {family: i for i, family in enumerate(families)}

        def position(key: str) -> tuple[int, int]:
            match = _METRIC_KEY.match(key)
            assert match is not None
            return order[match.group(1)], int(match.group(2))

        metrics = sorted(keys, key=position)
    header = ["run", "protocol", "split", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(row.get(c, "")) for c in header[:3]]
        cells += [f"{row[m]:.4f}" if isinstance(row.get(m), int | float) else "–" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_markdown(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """Runs compared in Markdown: one :func:`markdown_table` per protocol (in order of first
    appearance), so that metrics of one name but different protocols (ComiRec's recall@50 and
    leave-one-out's) never share a column. A single protocol gives a single table, no heading."""
    protocols = list(dict.fromkeys(str(row.get("protocol", "")) for row in rows))
    tables = {
        p: markdown_table([r for r in rows if str(r.get("protocol", "")) == p], metrics) for p in protocols
    }
    if len(tables) == 1:
        return next(iter(tables.values()))
    return "\n\n".join(f"### {protocol}\n\n{table}" for protocol, table in tables.items())
