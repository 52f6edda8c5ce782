"""Per-user results of a run, and paired comparisons of two runs on the same users.

A run's mean metric carries the spread of its users' difficulty: on ML-100K's 95 ComiRec test
users one standard error of Recall@50 is ~4% of it. Two models tested on the same users differ
far less from user to user than either varies, so their difference is judged per user
(:func:`paired_comparison`). :class:`UserMetrics` keeps the values a pairing needs (user id ->
metric value), written beside a run as :data:`USER_METRICS_FILE`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.evaluation.metrics import paired_difference

USER_METRICS_FILE = "user_metrics.csv"
Z_95 = 1.959964
"""The normal quantile of a two-sided 95% interval."""


@dataclass(frozen=True)
class PairedComparison:
    """Model a against model b on the same users, one metric.

    Attributes:
        users: users paired.
        mean_a: a's mean over the users.
        mean_b: b's mean over the users.
        difference: ``mean(a - b)``.
        se: its standard error, ``std(a - b) / sqrt(U)`` (``ddof = 1``).
        low: the 95% interval's lower end, ``difference - 1.96 se`` (normal approximation:
            too narrow below ~30 users).
        high: its upper end.
        relative: ``mean_a / mean_b - 1`` (NaN when ``mean_b`` is 0).
        relative_se: its standard error by the delta method for a ratio of paired means,
            ``std(a - R b) / (sqrt(U) mean_b)`` with ``R = mean_a / mean_b``: the error of
            ``mean_b`` is in it, not only the difference's.
    """

    users: int
    mean_a: float
    mean_b: float
    difference: float
    se: float
    low: float
    high: float
    relative: float
    relative_se: float

    @property
    def relative_interval(self) -> tuple[float, float]:
        """The 95% interval of :attr:`relative`."""
        return self.relative - Z_95 * self.relative_se, self.relative + Z_95 * self.relative_se


def paired_comparison(a: np.ndarray, b: np.ndarray) -> PairedComparison:
    """How much ``a`` exceeds ``b`` on the same users: difference, error, 95% interval, relative change.

    Args:
        a: float ``[U]``, one metric of a model per user.
        b: float ``[U]``, the same metric of the other model, same users in the same order.

    Raises:
        ValueError: vectors of different lengths or fewer than 2 users.
    """
    difference, se = paired_difference(a, b)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_b == 0:
        relative = relative_se = float("nan")
    else:
        ratio = mean_a / mean_b
        relative = ratio - 1.0
        relative_se = float((a - ratio * b).std(ddof=1) / (np.sqrt(len(a)) * abs(mean_b)))
    return PairedComparison(
        len(a), mean_a, mean_b, difference, se, difference - Z_95 * se, difference + Z_95 * se, relative,
        relative_se,
    )  # fmt: skip


@dataclass(frozen=True)
class UserMetrics:
    """Metric values per user of one evaluation (or several pooled), what pairing needs.

    Attributes:
        users: external user ids ``[U]``, each once.
        values: metric name -> float64 ``[U]``, aligned with :attr:`users`.
    """

    users: tuple[str, ...]
    values: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        if len(set(self.users)) != len(self.users):
            raise ValueError("a user appears more than once")
        for name, v in self.values.items():
            if np.shape(v) != (len(self.users),):
                raise ValueError(f"{name}: {np.shape(v)} values for {len(self.users)} users")

    def means(self) -> dict[str, float]:
        """Each metric's mean over the users."""
        return {name: float(v.mean()) for name, v in self.values.items()}

    def save(self, path: str | Path) -> None:
        """Writes a CSV: ``user`` then one column per metric, a row per user (exact floats)."""
        with Path(path).open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["user", *self.values])
            for row, user in enumerate(self.users):
                writer.writerow([user, *(repr(float(v[row])) for v in self.values.values())])

    @classmethod
    def load(cls, path: str | Path) -> UserMetrics:
        """What :meth:`save` wrote; a folder means its :data:`USER_METRICS_FILE`.

        Raises:
            ValueError: a missing or malformed file.
        """
        path = Path(path)
        file = path / USER_METRICS_FILE if path.is_dir() else path
        try:
            with file.open(newline="") as f:
                header, *rows = list(csv.reader(f))
            if header[:1] != ["user"] or any(len(r) != len(header) for r in rows):
                raise ValueError("expected a 'user' column and a value per metric on every row")
            return cls(
                tuple(r[0] for r in rows),
                {m: np.array([float(r[i]) for r in rows]) for i, m in enumerate(header[1:], 1)},
            )
        except (OSError, ValueError) as e:
            raise ValueError(f"{file}: cannot read per-user metrics: {e}") from None

    @classmethod
    def concat(cls, parts: Sequence[UserMetrics]) -> UserMetrics:
        """Disjoint sets of users as one (the folds of a cross-validation).

        Raises:
            ValueError: a user in two parts, or parts with different metrics.
        """
        names = list(parts[0].values)
        if any(list(p.values) != names for p in parts):
            raise ValueError("the parts measure different metrics")
        users = tuple(u for p in parts for u in p.users)
        return cls(users, {m: np.concatenate([p.values[m] for p in parts]) for m in names})

    @classmethod
    def average(cls, parts: Sequence[UserMetrics]) -> UserMetrics:
        """Per user, the mean over runs of the same users (the seeds of a configuration)."""
        first = parts[0]
        aligned = [p.aligned_with(first) for p in parts]
        return cls(first.users, {m: np.mean([p.values[m] for p in aligned], axis=0) for m in first.values})

    def aligned_with(self, other: UserMetrics) -> UserMetrics:
        """These values in ``other``'s user order.

        Raises:
            ValueError: the two do not hold the same users.
        """
        if set(self.users) != set(other.users):
            only = len(set(self.users) - set(other.users)), len(set(other.users) - set(self.users))
            raise ValueError(f"different users: {only[0]} only in one, {only[1]} only in the other")
        position = {u: i for i, u in enumerate(self.users)}
        order = np.array([position[u] for u in other.users], np.int64)
        return UserMetrics(other.users, {m: v[order] for m, v in self.values.items()})


def compare_user_metrics(
    a: UserMetrics, b: UserMetrics, metrics: Iterable[str] | None = None
) -> dict[str, PairedComparison]:
    """Every metric both measure (or ``metrics``, in order): a against b, paired by user id.

    Raises:
        ValueError: different users, or a metric one of them lacks.
    """
    b_ = b.aligned_with(a)
    names = list(metrics) if metrics is not None else [m for m in a.values if m in b.values]
    missing = [m for m in names if m not in a.values or m not in b.values]
    if missing:
        raise ValueError(f"metric(s) {', '.join(missing)} not measured by both")
    return {m: paired_comparison(a.values[m], b_.values[m]) for m in names}
