"""Splits and evaluation protocols: which users and items are held out, and what a target is ranked against.

* ``loo``: leave-one-out (:func:`leave_one_out`): the last item of every
  sequence is the test target, the second-to-last the validation target; ranked against the
  whole catalogue with the user's history excluded.
* ``loo-sampled``: the same split, the target ranked against ``num_negatives`` (100) items the
  user never interacted with, drawn uniformly (:func:`sample_negatives`); SASRec's protocol.
* ``comirec``: ComiRec's split (:func:`comirec_split`): users, not events, are divided 8:1:1
  into training, validation and test users; a validation or test user's first 80% of events
  are the history and the remaining 20% the targets. Models are trained on the training
  users' whole sequences only. With ``folds = N`` (:func:`comirec_users`) the users are cut
  into N disjoint test folds instead, so that N runs test every user once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

if TYPE_CHECKING:
    from retrieval.data.interactions import SequenceData

EvaluationProtocol = Literal["loo", "loo-sampled", "comirec"]
"""The evaluation protocols (``tools/evaluate.py --protocol``); a training run's ``loo`` and
``comirec`` (``DataConfig.protocol``) are scored as the ones of the same name."""
PROTOCOLS: tuple[EvaluationProtocol, ...] = get_args(EvaluationProtocol)
DEFAULT_SEED = 42
"""Seed of the ComiRec user split and of the sampled negatives when none is given."""
MIN_EVAL_LENGTH = 2
"""Events a ComiRec validation/test user needs: at least one history item and one target."""


@dataclass(frozen=True)
class ComirecSplit:
    """ComiRec's user split. User numbers are positions in the sequences given to :func:`comirec_split`.

    Attributes:
        train: the training users' whole sequences, in :attr:`train_users` order.
        train_users: int64 ``[num_train]``, ascending.
        valid_histories: per validation user, the first events (``history_length``).
        valid_targets: per validation user, the remaining events, in order.
        valid_users: int64 ``[num_valid]``, ascending.
        test_histories: per test user, as for validation.
        test_targets: per test user, as for validation.
        test_users: int64 ``[num_test]``, ascending.
        dropped_users: int64, validation/test users with fewer than :data:`MIN_EVAL_LENGTH`
            events: they cannot be split into history and targets, so they are neither
            evaluated nor trained on.
    """

    train: tuple[np.ndarray, ...]
    train_users: np.ndarray
    valid_histories: tuple[np.ndarray, ...]
    valid_targets: tuple[np.ndarray, ...]
    valid_users: np.ndarray
    test_histories: tuple[np.ndarray, ...]
    test_targets: tuple[np.ndarray, ...]
    test_users: np.ndarray
    dropped_users: np.ndarray


def history_length(n: int, history_fraction: float = 0.8) -> int:
    """How many of a held-out user's ``n`` events form the history; the rest are targets.

    ComiRec's rule ``int(n * history_fraction)``, kept within ``1 .. n - 1`` so that every
    split sequence has a history and a target. With the default 0.8: n = 2 -> 1 + 1,
    3 -> 2 + 1, 4 -> 3 + 1, 5 -> 4 + 1, 9 -> 7 + 2, 10 -> 8 + 2 (history + targets).

    Raises:
        ValueError: ``n < 2`` (nothing to split) or a fraction outside ``(0, 1)``.
    """
    if not 0.0 < history_fraction < 1.0:
        raise ValueError(f"history_fraction must be in (0, 1), got {history_fraction}")
    if n < MIN_EVAL_LENGTH:
        raise ValueError(f"a sequence of {n} event(s) cannot be split into history and targets")
    return min(max(int(n * history_fraction), 1), n - 1)


def comirec_users(
    num_users: int,
    seed: int = DEFAULT_SEED,
    user_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    folds: int = 1,
    fold: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which users train, validate and test under ComiRec's protocol, in ``folds`` folds or one split.

    The users are shuffled with ``seed``. With ``folds = 1`` (ComiRec's own split) the first
    ``int(U * 0.8)`` train, the next ``int(U * 0.9) - int(U * 0.8)`` validate, the rest test.
    With ``folds = N >= 2`` the shuffled users are cut into N contiguous folds of
    ``U // N`` or ``U // N + 1`` users; fold ``fold`` tests, and of the other users in shuffled
    order the last ``int(U * user_fractions[1])`` validate and the rest train. Every user is
    then tested in exactly one fold, and validation never meets test. Validation is a slice of
    the training folds rather than a fold of its own so that training keeps ``1 - 1/N - 0.1``
    of the users (8:1:1 at N = 10, as ComiRec; a whole validation fold would leave none at
    N = 2). With N = 10 the last fold (``fold = 9``) is the single split up to rounding.

    Args:
        num_users: users are ``0 .. num_users - 1``.
        seed: the shuffle's seed; the same seed always gives the same folds.
        user_fractions: training, validation and test shares (summing to 1); with folds, only
            the validation share is read (the test share is ``1 / folds``, training the rest).
        folds: the number of disjoint test folds (1 = the single 8:1:1 split).
        fold: the test fold, ``0 .. folds - 1``.

    Returns:
        int64 ``(train, valid, test)`` user numbers, each ascending, disjoint, together all users.

    Raises:
        ValueError: fractions not three shares summing to 1, ``folds < 1``, more folds than
            users, or ``fold`` outside ``0 .. folds - 1``.
    """
    if len(user_fractions) != 3 or min(user_fractions) < 0 or not np.isclose(sum(user_fractions), 1.0):
        raise ValueError(f"user_fractions must be three shares summing to 1, got {user_fractions}")
    if folds < 1 or not 0 <= fold < folds:
        raise ValueError(f"need folds >= 1 and 0 <= fold < folds, got fold {fold} of {folds}")
    if folds > max(num_users, 1):
        raise ValueError(f"{folds} folds of {num_users} users: a fold would be empty")
    order = np.random.default_rng(seed).permutation(num_users)
    if folds == 1:
        cut_train = int(num_users * user_fractions[0])
        cut_valid = int(num_users * (user_fractions[0] + user_fractions[1]))
        parts = order[:cut_train], order[cut_train:cut_valid], order[cut_valid:]
    else:
        start, stop = fold * num_users // folds, (fold + 1) * num_users // folds
        rest = np.concatenate([order[:start], order[stop:]])
        cut = len(rest) - int(num_users * user_fractions[1])
        parts = rest[:cut], rest[cut:], order[start:stop]
    train, valid, test = (np.sort(users).astype(np.int64) for users in parts)
    return train, valid, test


def comirec_split(
    sequences: Sequence[np.ndarray],
    seed: int = DEFAULT_SEED,
    user_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    history_fraction: float = 0.8,
    folds: int = 1,
    fold: int = 0,
) -> ComirecSplit:
    """ComiRec's protocol split (``preprocess/data.py`` and ``DataIterator`` of THUDM/ComiRec).

    Users are divided by :func:`comirec_users`: with ``folds = 1`` ComiRec's 8:1:1 (the first
    ``int(U * 0.8)`` shuffled users train, the next ``int(U * 0.9) - int(U * 0.8)`` validate,
    the rest test); with ``folds = N`` fold ``fold`` of N disjoint folds tests. Each held-out
    user's sequence is cut by :func:`history_length`. Held-out users with fewer than
    :data:`MIN_EVAL_LENGTH` events are dropped (see :attr:`ComirecSplit.dropped_users`).

    Args:
        sequences: per user, int ``[len]`` item ids, oldest first (``SequenceData.sequences``).
        seed: the shuffle's seed; the same seed always gives the same split.
        user_fractions: training, validation and test shares of the users (summing to 1).
        history_fraction: share of a held-out sequence used as history.
        folds: disjoint test folds (1 = the single split).
        fold: the test fold, ``0 .. folds - 1``.

    Returns:
        The split; the trainer trains on ``split.train`` only.

    Example:
        >>> split = comirec_split(data.sequences, seed=42)
        >>> model.fit(examples_from(split.train)); evaluate(split.test_histories, split.test_targets)
    """
    history_length(MIN_EVAL_LENGTH, history_fraction)  # validates the fraction
    train_users, *held_out = comirec_users(len(sequences), seed, user_fractions, folds, fold)
    too_short = [users[[len(sequences[u]) < MIN_EVAL_LENGTH for u in users]] for users in held_out]
    valid_users, test_users = (
        users[[len(sequences[u]) >= MIN_EVAL_LENGTH for u in users]].astype(np.int64) for users in held_out
    )

    def cut(users: np.ndarray) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        lengths = [history_length(len(sequences[u]), history_fraction) for u in users]
        histories = tuple(np.asarray(sequences[u])[:h] for u, h in zip(users, lengths, strict=True))
        targets = tuple(np.asarray(sequences[u])[h:] for u, h in zip(users, lengths, strict=True))
        return histories, targets

    valid_histories, valid_targets = cut(valid_users)
    test_histories, test_targets = cut(test_users)
    return ComirecSplit(
        train=tuple(np.asarray(sequences[u]) for u in train_users),
        train_users=train_users,
        valid_histories=valid_histories,
        valid_targets=valid_targets,
        valid_users=valid_users,
        test_histories=test_histories,
        test_targets=test_targets,
        test_users=test_users,
        dropped_users=np.sort(np.concatenate(too_short)).astype(np.int64),
    )


def sample_negatives(
    user_items: Sequence[np.ndarray], num_items: int, num_negatives: int = 100, seed: int = DEFAULT_SEED
) -> np.ndarray:
    """Per user, ``num_negatives`` distinct items drawn uniformly from those the user never touched.

    SASRec's sampled protocol, with two deliberate differences from its code: negatives are
    distinct (SASRec draws with replacement), and every item of the user's sequence is
    excluded, the target included (SASRec excludes only the training items, so the target
    itself or the validation item can come back as a "negative").

    Args:
        user_items: per user, int item ids to avoid (the whole sequence, target included);
            ids outside ``1..num_items`` (padding, unknown items) are ignored.
        num_items: the catalogue is ``1..num_items`` (0 is padding).
        num_negatives: negatives per user.
        seed: the same seed and inputs always give the same negatives.

    Returns:
        int64 ``[U, num_negatives]``.

    Raises:
        ValueError: a user has fewer than ``num_negatives`` items left to draw from.
    """
    rng = np.random.default_rng(seed)
    out = np.zeros((len(user_items), num_negatives), np.int64)
    for row, items in enumerate(user_items):
        avoid = np.unique(np.asarray(items, np.int64))
        avoid = avoid[(avoid >= 1) & (avoid <= num_items)]
        available = num_items - len(avoid)
        if available < num_negatives:
            raise ValueError(
                f"user {row} has only {available} items left to sample {num_negatives} negatives from "
                f"({num_items} items, {len(avoid)} interacted with)"
            )
        if available < 4 * num_negatives:  # dense: draw from the explicit complement
            pool = np.setdiff1d(np.arange(1, num_items + 1), avoid)
            out[row] = rng.choice(pool, num_negatives, replace=False)
            continue
        picked: np.ndarray = np.zeros(0, np.int64)
        while len(picked) < num_negatives:  # rejection sampling; accepts >= 75% of draws here
            draw = rng.integers(1, num_items + 1, size=2 * num_negatives)
            draw = draw[~np.isin(draw, avoid)]
            merged = np.concatenate([picked, draw])
            _, first = np.unique(merged, return_index=True)
            picked = merged[np.sort(first)]  # distinct, in draw order
        out[row] = picked[:num_negatives]
    return out


@dataclass(frozen=True)
class LeaveOneOut:
    """Leave-one-out split: last item for test, second-to-last for validation.

    Users with fewer than 3 items train on their whole sequence and have no valid/test example.
    A refitted split (``leave_one_out(..., refit=True)``) trains on ``sequence[:-1]`` and has no
    validation users.

    Attributes:
        train: per user, ``sequence[:-2]`` (the whole sequence for users with < 3 items).
        valid_histories: ``sequence[:-2]`` per validation user.
        valid_targets: int64 ``[num_valid]``, ``sequence[-2]``.
        valid_users: int64 ``[num_valid]`` positions in :attr:`SequenceData.users`.
        test_histories: ``sequence[:-1]`` per test user.
        test_targets: int64 ``[num_test]``, ``sequence[-1]``.
        test_users: int64 ``[num_test]`` positions in :attr:`SequenceData.users`.
    """

    train: tuple[np.ndarray, ...]
    valid_histories: tuple[np.ndarray, ...]
    valid_targets: np.ndarray
    valid_users: np.ndarray
    test_histories: tuple[np.ndarray, ...]
    test_targets: np.ndarray
    test_users: np.ndarray


def leave_one_out(data: SequenceData, refit: bool = False) -> LeaveOneOut:
    """Splits each sequence: last item for test, second-to-last for validation, the rest for training.

    With ``refit`` the validation event trains too (``sequence[:-1]``) and there are no
    validation users: the model for the test is fitted on every event before it, for a number
    of epochs chosen beforehand by a run without ``refit`` (nothing is left to validate on).
    """
    evaluated = [u for u, s in enumerate(data.sequences) if len(s) >= 3]
    held_out = [data.sequences[u] for u in evaluated]
    keep = 1 if refit else 2
    validated = [] if refit else held_out
    return LeaveOneOut(
        train=tuple(s if len(s) < 3 else s[:-keep] for s in data.sequences),
        valid_histories=tuple(s[:-2] for s in validated),
        valid_targets=np.array([s[-2] for s in validated], np.int64),
        valid_users=np.array([] if refit else evaluated, np.int64),
        test_histories=tuple(s[:-1] for s in held_out),
        test_targets=np.array([s[-1] for s in held_out], np.int64),
        test_users=np.array(evaluated, np.int64),
    )
