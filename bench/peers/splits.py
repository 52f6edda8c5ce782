"""The data every side of the benchmark reads and the split it trains and is evaluated on.

The split is made by the library's own functions (``retrieval.data.leave_one_out``,
``retrieval.data.comirec_split``), in our dense item ids, then written for the runners in our
external ids (``split.json``; for RecBole also its atomic ``.inter`` file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROTOCOLS = ("loo", "comirec")

RECBOLE_DATASET = "bench"
"""RecBole's dataset name: it reads ``<data_path>/<name>/<name>.inter``."""


@dataclass(frozen=True)
class BenchSplit:
    """What every side of one protocol trains and is evaluated on, in our dense item ids.

    Attributes:
        protocol: ``loo`` (``retrieval.data.splits.leave_one_out``) or ``comirec``
            (``retrieval.data.splits.comirec_split``).
        items: our external item ids; dense id ``i + 1`` is ``items[i]`` (0 = padding).
        users: external user ids, all users of the data.
        sequences: every user's whole sequence (dense ids, oldest first).
        train: the training sequences, one per training user (``train_users``).
        train_users: positions in :attr:`users` of the training sequences.
        valid_users, valid_histories, valid_targets: validation users (positions), their
            histories and their targets (one array each: one item for ``loo``, the remaining
            20% of the sequence for ``comirec``).
        test_users, test_histories, test_targets: the same for test.
    """

    protocol: str
    items: tuple[str, ...]
    users: tuple[str, ...]
    sequences: tuple[np.ndarray, ...]
    train: tuple[np.ndarray, ...]
    train_users: np.ndarray
    valid_users: np.ndarray
    valid_histories: tuple[np.ndarray, ...]
    valid_targets: tuple[np.ndarray, ...]
    test_users: np.ndarray
    test_histories: tuple[np.ndarray, ...]
    test_targets: tuple[np.ndarray, ...]

    def part(self, name: str) -> tuple[np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """``(users, histories, targets)`` of ``valid`` or ``test``."""
        if name == "valid":
            return self.valid_users, self.valid_histories, self.valid_targets
        if name == "test":
            return self.test_users, self.test_histories, self.test_targets
        raise ValueError(f"part must be 'valid' or 'test', got {name!r}")


def make_split(data: Any, protocol: str, seed: int = 42) -> BenchSplit:
    """The split of ``data`` (a ``retrieval.data.interactions.SequenceData``) under ``protocol``, made by the
    library's own functions, so that it is the one our training and evaluation use.

    ``loo``: every user trains on ``sequence[:-2]`` (the whole sequence below 3 events); users
    with 3 or more events are evaluated. ``comirec``: the training users train on their whole
    sequences; validation and test users are evaluated on (first 80%, rest).
    """
    from retrieval.data import comirec_split, leave_one_out

    sequences = tuple(np.asarray(s, np.int64) for s in data.sequences)
    parts: Any
    if protocol == "loo":  # one target per evaluated user
        parts = leave_one_out(data)
        train_users = np.arange(len(sequences), dtype=np.int64)
        valid_targets = tuple(np.asarray([t]) for t in parts.valid_targets)
        test_targets = tuple(np.asarray([t]) for t in parts.test_targets)
    elif protocol == "comirec":
        parts = comirec_split(sequences, seed)
        train_users, valid_targets, test_targets = parts.train_users, parts.valid_targets, parts.test_targets
    else:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return BenchSplit(
        protocol,
        tuple(data.vocab.ids),
        tuple(data.users),
        sequences,
        tuple(parts.train),
        train_users,
        parts.valid_users,
        tuple(parts.valid_histories),
        tuple(valid_targets),
        parts.test_users,
        tuple(parts.test_histories),
        tuple(test_targets),
    )


def split_payload(split: BenchSplit) -> dict[str, Any]:
    """The split as the runners read it (``split.json``): everything in our external ids, so a
    runner maps them to its own ids and back, and knows nothing of our dense ids."""
    items = split.items

    def external(seq: np.ndarray) -> list[str]:
        return [items[int(i) - 1] for i in seq]

    payload: dict[str, Any] = {
        "protocol": split.protocol,
        "items": list(items),
        "train_users": [split.users[u] for u in split.train_users],
        "train": [external(s) for s in split.train],
    }
    for name in ("valid", "test"):
        users, histories, targets = split.part(name)
        payload[name] = {
            "users": [split.users[u] for u in users],
            "histories": [external(h) for h in histories],
            "targets": [external(t) for t in targets],
        }
    return payload


def recbole_atomic_inter(split: BenchSplit) -> str:
    """RecBole's atomic ``.inter`` file for a ``loo`` split: every user's whole sequence with its
    position as the timestamp, so that RecBole's own leave-one-out (``eval_args.split =
    {'LS': 'valid_and_test'}``, ``order: TO``) cuts exactly our split; users with fewer than
    3 events keep only the training events (ours train on them and evaluate nothing).

    Item tokens are our external ids, user tokens our external user ids.
    """
    if split.protocol != "loo":
        raise ValueError("RecBole runs on the leave-one-out split only")
    lines = ["user_id:token\titem_id:token\ttimestamp:float"]
    evaluated = set(split.test_users.tolist())
    for u, seq in enumerate(split.sequences):
        events = seq if u in evaluated else split.train[u]
        user = split.users[u]
        lines += [f"{user}\t{split.items[int(i) - 1]}\t{t}" for t, i in enumerate(events)]
    return "\n".join(lines) + "\n"


def check_recbole_split(split: BenchSplit, reported: Mapping[str, Any], max_len: int) -> dict[str, Any]:
    """Compares the split RecBole made from the atomic file with ours.

    Args:
        split: our ``loo`` split.
        reported: the runner's ``split_check``: ``valid`` and ``test`` map user -> target,
            ``valid_histories`` and ``test_histories`` user -> its newest ``max_len`` history
            items (external ids), ``train_instances`` RecBole's training (prefix, next item) pairs.
        max_len: history length read by the models.

    Returns:
        ``{"equal": bool, "problems": [...]}``; ``equal`` when every evaluated user's targets and
        (truncated) histories match ours and RecBole trains on as many next-item pairs as our
        training sequences hold.
    """
    problems = []
    for name in ("valid", "test"):
        users, histories, targets = split.part(name)
        ids = [split.users[u] for u in users]
        ours = dict(zip(ids, (split.items[int(t[0]) - 1] for t in targets), strict=True))
        theirs = {str(k): str(v) for k, v in dict(reported.get(name, {})).items()}
        if ours != theirs:
            differ = sorted(u for u in set(ours) | set(theirs) if ours.get(u) != theirs.get(u))
            problems.append(f"{name} targets: {len(differ)} users differ (e.g. {differ[:3]})")
        ours_h = {
            u: [split.items[int(i) - 1] for i in h[-max_len:]] for u, h in zip(ids, histories, strict=True)
        }
        theirs_h = {
            str(k): [str(i) for i in v] for k, v in dict(reported.get(f"{name}_histories", {})).items()
        }
        if ours_h != theirs_h:
            differ = sorted(u for u in set(ours_h) | set(theirs_h) if ours_h.get(u) != theirs_h.get(u))
            problems.append(f"{name} histories: {len(differ)} users differ (e.g. {differ[:3]})")
    pairs = int(sum(max(len(s) - 1, 0) for s in split.train))
    if int(reported.get("train_instances", -1)) != pairs:
        problems.append(f"training pairs: ours {pairs}, RecBole {reported.get('train_instances')}")
    return {"equal": not problems, "problems": problems}


def write_split(split: BenchSplit, folder: Path) -> Path:
    """Writes ``split.json`` (and for ``loo`` RecBole's ``bench/bench.inter``) into ``folder``
    unless already there; returns the ``split.json`` path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "split.json"
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(split_payload(split)))
        tmp.replace(path)
    if split.protocol == "loo":
        atomic = folder / "recbole" / RECBOLE_DATASET / f"{RECBOLE_DATASET}.inter"
        if not atomic.is_file():
            atomic.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(recbole_atomic_inter(split))
    return path


def dataset_slug(data: str, max_users: int) -> str:
    """The folder name of a dataset's runs: the file's stem or the folder's name."""
    path = Path(data)
    slug = path.stem if path.suffix else path.name
    return f"{slug}-{max_users}users" if max_users else slug


def load_data(data: str, max_users: int, folder: Path) -> tuple[str, Any]:
    """The dataset every side reads, and its sequences. With ``max_users``, the first users
    (in file order) are written as an S3-Rec sequence file in ``folder`` and that file is the
    dataset (for a quick check of the pipeline on a slice)."""
    from retrieval.data import build_sequences, load_interactions

    sequences = build_sequences(load_interactions(data))
    if not max_users:
        return data, sequences
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.txt"
    lines = [
        " ".join([user, *(sequences.vocab.ids[int(i) - 1] for i in seq)])
        for user, seq in list(zip(sequences.users, sequences.sequences, strict=True))[:max_users]
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path), build_sequences(load_interactions(path))
