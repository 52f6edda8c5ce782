"""Our evaluator on the vectors every side exports: exact full ranking, history excluded, on the
one split, so that only the models differ."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.peers.splits import BenchSplit

LOO_KS = (10, 20, 50)
COMIREC_KS = (20, 50)


def align_items(
    item_ids: Sequence[str], vectors: np.ndarray, items: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """A peer's item vectors, keyed by our external ids, as a table in our dense order.

    Args:
        item_ids: the external id of each row of ``vectors``.
        vectors: float ``[n, d]``.
        items: our vocabulary (dense id ``i + 1`` = ``items[i]``).

    Returns:
        ``(table, missing)``: float32 ``[len(items) + 1, d]`` with row 0 (padding) and the rows
        of items the peer has no vector for all zero, and the dense ids of those items (they
        must be kept out of every ranking: see :func:`evaluate_vectors`).

    Raises:
        ValueError: an id the vocabulary does not know, or a row count that differs from the ids.
    """
    if len(item_ids) != len(vectors):
        raise ValueError(f"{len(vectors)} item vectors for {len(item_ids)} ids")
    index = {item: i + 1 for i, item in enumerate(items)}
    unknown = [i for i in item_ids if i not in index]
    if unknown:
        raise ValueError(f"{len(unknown)} exported item ids are not in the data (e.g. {unknown[:3]})")
    table = np.zeros((len(items) + 1, vectors.shape[1]), np.float32)
    rows = np.fromiter((index[i] for i in item_ids), np.int64, len(item_ids))
    table[rows] = vectors
    covered = np.zeros(len(items) + 1, bool)
    covered[rows] = True
    missing = np.flatnonzero(~covered[1:]) + 1
    return table, missing.astype(np.int64)


def evaluate_vectors(
    user_vectors: np.ndarray,
    item_table: np.ndarray,
    histories: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    protocol: str,
    missing: np.ndarray | None = None,
) -> dict[str, float]:
    """Our evaluator on exported vectors: exact full ranking, history excluded, best interest
    per item (``retrieval.evaluation.evaluate.exact_top_k``), then ``ranking_metrics`` (``loo``: HR, NDCG,
    Recall at 10/20/50) or ComiRec's ``comirec_metrics`` (Recall, HitRate, NDCG at 20/50).

    This is :func:`retrieval.evaluation.evaluate.evaluate_ranking` / ``evaluate_comirec`` with the user
    tower's output given instead of computed.

    Args:
        user_vectors: float ``[U, K, d]``, aligned with ``histories``.
        item_table: float ``[V, d]`` in our dense ids (row 0 = padding).
        histories: per user, dense ids excluded from its ranking.
        targets: per user, the held-out dense ids.
        protocol: ``loo`` or ``comirec``.
        missing: dense ids without a vector (:func:`align_items`): never ranked.
    """
    from retrieval.evaluation import comirec_metrics, exact_top_k, ranking_metrics

    if len(user_vectors) != len(histories):
        raise ValueError(f"{len(user_vectors)} user vectors for {len(histories)} users")
    exclude: Sequence[np.ndarray] = histories
    if missing is not None and len(missing):
        exclude = [np.union1d(h, missing) for h in histories]
    ks = LOO_KS if protocol == "loo" else COMIREC_KS
    top = exact_top_k(
        np.asarray(user_vectors, np.float32), np.asarray(item_table, np.float32), exclude, max(ks)
    )
    if protocol == "loo":
        return ranking_metrics(top, targets, ks)
    return comirec_metrics(top, targets, ks)


def validation_metrics(
    user_vectors: np.ndarray, item_table: np.ndarray, split: BenchSplit, missing: np.ndarray | None = None
) -> dict[str, float]:
    """The validation users' metrics under ``split``'s protocol, as our training computes them
    every epoch, so that both sides' best epochs are chosen by one rule (:data:`SELECT_BY`)."""
    _, histories, targets = split.part("valid")
    return evaluate_vectors(user_vectors, item_table, histories, targets, split.protocol, missing)


SELECT_BY = {"loo": "ndcg@10", "comirec": "recall@50"}
"""Per protocol, the validation metric that picks a run's best epoch: our training's early
stopping metric under that protocol (``retrieval.training.protocols.make_protocol``)."""
