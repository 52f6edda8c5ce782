"""Cold start: items never seen in training, ranked through their attributes alone.

    python -m bench.cold_start --datasets beauty sports --seeds 42 43 44 --epochs 20
    python -m bench.cold_start --datasets beauty --id-dropout 0.5 0 --hold-out 0.1

The protocol, per dataset:

1. A random share of the items (``--hold-out``, 10%, drawn with ``--split-seed``: the same for
   every training seed) is held out: their events leave every user's sequence before the
   leave-one-out split, so training never sees them (:func:`hold_out`). The rest is written as
   an S3-Rec file with its attributes (order only: the model reads no time feature).
2. The tower (``sasrec``, ``nova`` fusion of the item attributes, from the preset
   ``<dataset>-sasrec``) trains on it once per ``--id-dropout`` (``model.id_dropout``) and seed.
   Its own test (leave-one-out on the reduced data, warm items only) is the warm table: what
   id-dropout costs the items it has seen.
3. The cold test users are those whose real last event (in the original sequence, of at least
   3 events) is a held-out item. Their history is every event before it; the tower reads it
   without the held-out items (it cannot), the ranking excludes all of it.
4. Each cold target is ranked among all items: the model's warm vectors plus the cold-start
   vectors of the held-out items (:func:`retrieval.artifacts.catalogue.cold_vectors`, the mean
   of their known attributes' embeddings). Against it: random vectors for the held-out items
   (their mean norm that of the cold vectors; same users and warm vectors), and popularity
   (training counts: a held-out item has none, so it ties with the least popular at the bottom).

A held-out item with no attribute the model knows has no vector: never retrieved (a miss when
it is the target); the report counts them. Ranks count ties against the target. Metrics per
user: Recall@50 (= HR@50: one target), NDCG@50, HR@10, NDCG@10 and the target's rank (0 = first);
averaged over the users, then mean ± sample std over the seeds. Writes ``results.json`` and
``results.md`` into ``--out`` after every run; the runs are ``OUT/<dataset>/<tower>-<fusion>-
iddrop<p>/seed<N>`` (a finished run is read back, an interrupted one resumes: ``bench.quality``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.context import load_average, measured, run_meta
from bench.data import add_data_root_argument
from bench.markdown import mean_cell
from bench.markdown import table as markdown_table
from bench.quality import DEFAULT_SEEDS, Dataset, Run, mean_std, resolve_dataset, run_config, run_one
from retrieval.artifacts import ModelArtifact, cold_vectors, encode_histories, load_model
from retrieval.data import PAD, SequenceData, build_sequences, leave_one_out, load_interactions
from retrieval.evaluation import mask_excluded
from retrieval.training import Config, takes_side_information
from towers import tower_names
from towers.side import FUSIONS

HOLD_OUT = 0.1
SPLIT_SEED = 42
DROPOUTS = (0.5, 0.0)
KS = (10, 50)
COLUMNS = ("recall@50", "ndcg@50", "hr@10", "ndcg@10")
WARM_COLUMNS = ("hr@50", "ndcg@50", "hr@10", "ndcg@10")
"""The warm test's metrics (the training run's leave-one-out: its HR@50 is its Recall@50)."""
METHODS = ("cold path", "random vectors", "popularity")
_USER_BATCH = 256
_TIE = 1e-6  # relative: float32 scores this close to the target's tie with it

__all__ = ["ColdUsers", "HeldOut", "evaluate_cold", "hold_out", "main", "rank_metrics", "target_ranks"]


@dataclass(frozen=True)
class ColdUsers:
    """The test users whose real last event is a held-out item.

    Attributes:
        users: their external ids, in the data's user order.
        histories: per user, the external ids before the target (held-out items included).
        targets: per user, the held-out item of the last event.
        dropped: users left out: no event of their history is a warm item (nothing to read).
    """

    users: tuple[str, ...]
    histories: tuple[tuple[str, ...], ...]
    targets: tuple[str, ...]
    dropped: int


@dataclass(frozen=True)
class HeldOut:
    """A dataset split for the protocol.

    Attributes:
        items: the held-out external item ids.
        attributes: their attributes (empty when the data has none for one).
        data_path: the reduced interactions (no held-out item), what the trainer reads.
        counts: external item id -> training events (leave-one-out's training part of the
            reduced data), for the popularity baseline.
        cold: the cold test users.
        warm_users: the reduced data's leave-one-out test users (the warm table's).
    """

    items: tuple[str, ...]
    attributes: dict[str, tuple[str, ...]]
    data_path: Path
    counts: dict[str, int]
    cold: ColdUsers
    warm_users: int


def choose_items(items: Sequence[str], share: float, seed: int) -> tuple[str, ...]:
    """``round(share * len(items))`` of ``items`` drawn without replacement with ``seed``, in
    the order of ``items``."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the held-out share must be in (0, 1), got {share}")
    picked = np.random.default_rng(seed).choice(len(items), round(share * len(items)), replace=False)
    return tuple(items[i] for i in np.sort(picked))


def reduced_sequences(data: SequenceData, held: set[str]) -> dict[str, list[str]]:
    """Every user's events (external item ids, oldest first) without the held-out items; users
    with none left are left out."""
    ids = data.vocab.ids
    out = {}
    for user, sequence in zip(data.users, data.sequences, strict=True):
        kept = [ids[i - 1] for i in sequence if ids[i - 1] not in held]
        if kept:
            out[user] = kept
    return out


def cold_users(data: SequenceData, held: set[str]) -> ColdUsers:
    """The users of ``data``'s leave-one-out test (3 events or more) whose last item is in ``held``."""
    ids = data.vocab.ids
    users, histories, targets, dropped = [], [], [], 0
    for user, sequence in zip(data.users, data.sequences, strict=True):
        if len(sequence) < 3 or ids[sequence[-1] - 1] not in held:
            continue
        history = tuple(ids[i - 1] for i in sequence[:-1])
        if all(i in held for i in history):
            dropped += 1
            continue
        users.append(user)
        histories.append(history)
        targets.append(ids[sequence[-1] - 1])
    return ColdUsers(tuple(users), tuple(histories), tuple(targets), dropped)


def write_sequences(
    sequences: Mapping[str, Sequence[str]], attributes: Mapping[str, Sequence[str]], folder: Path
) -> Path:
    """Writes ``folder/data.txt`` (S3-Rec: ``user item item ...`` per line) and the attributes of
    its items in ``folder/data_item2attributes.json``; returns the first.

    Raises:
        ValueError: an id that is not a number (the format's ids are).
    """
    ids = [*sequences, *(i for s in sequences.values() for i in s)]
    if not all(x.isascii() and x.isdigit() for x in ids):
        raise ValueError("the protocol writes S3-Rec files, whose user and item ids are numbers")
    folder.mkdir(parents=True, exist_ok=True)
    kept = {i for s in sequences.values() for i in s}
    table = {i: list(a) for i, a in attributes.items() if i in kept and a}
    path = folder / "data.txt"
    for target, text in (
        (folder / "data_item2attributes.json", json.dumps(table)),
        (path, "".join(" ".join([u, *s]) + "\n" for u, s in sequences.items())),
    ):
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(target)  # a run reading it never sees half a file
    return path


def hold_out(source: str, share: float, seed: int, folder: Path) -> HeldOut:
    """Holds ``share`` of ``source``'s items out (:func:`choose_items`), writes the rest into
    ``folder`` (:func:`write_sequences`) and finds the cold test users.

    Raises:
        ValueError: data without item attributes (nothing to embed a cold item with).
    """
    interactions = load_interactions(source)
    if "attributes" not in interactions.items.columns:
        raise ValueError(f"{source} has no item attributes: cold items cannot be embedded")
    data = build_sequences(interactions)
    held = choose_items(data.vocab.ids, share, seed)
    every = {
        str(i): tuple(map(str, a or ()))
        for i, a in zip(interactions.items["item"], interactions.items["attributes"], strict=True)
    }
    path = write_sequences(reduced_sequences(data, set(held)), every, folder)
    reduced = build_sequences(load_interactions(path))
    split = leave_one_out(reduced)
    counts = np.bincount(np.concatenate(split.train), minlength=reduced.vocab.num_embeddings)
    return HeldOut(
        held,
        {i: every.get(i, ()) for i in held},
        path,
        {i: int(c) for i, c in zip(reduced.vocab.ids, counts[1:], strict=True)},
        cold_users(data, set(held)),
        len(split.test_users),
    )


# --------------------------------------------------------------------------- ranking


def target_ranks(
    scores_for: Callable[[slice], np.ndarray], exclude: Sequence[np.ndarray], targets: np.ndarray
) -> np.ndarray:
    """Each user's target rank among the items it may be shown: how many of them score at least
    as high as it (0 = first; ties, scores within float32 rounding of its own, count against
    it). A target in ``exclude`` is a miss: it ranks after every item.

    Args:
        scores_for: users (a slice) -> their scores float ``[b, V]`` (column 0, padding, ignored).
        exclude: per user, ids never shown (the history, items without a vector).
        targets: int ``[U]`` ids in ``1..V-1``.

    Returns:
        int64 ``[U]``.
    """
    out = np.zeros(len(targets), np.int64)
    for start in range(0, len(targets), _USER_BATCH):
        rows = slice(start, start + _USER_BATCH)
        scores = mask_excluded(np.array(scores_for(rows), np.float64), exclude[rows])
        own = scores[np.arange(len(scores)), targets[rows]]  # [b]
        # Equal vectors can score a few float32 ulps apart (a BLAS product's summation order
        # depends on the row's position): a score within _TIE of the target's is a tie.
        ahead = (scores >= own[:, None] - _TIE * np.abs(own[:, None])).sum(axis=1) - 1
        out[rows] = np.where(np.isneginf(own), scores.shape[1] - 1, ahead)
    return out


def rank_metrics(ranks: np.ndarray, ks: Sequence[int] = KS) -> dict[str, np.ndarray]:
    """Per user, from the rank of one target (0 = first): ``hr@k``, ``recall@k`` (the same with
    one target) and ``ndcg@k`` (``1 / log2(rank + 2)`` within the top k), float ``[U]``."""
    out = {}
    for k in ks:
        hit = ranks < k
        out[f"hr@{k}"] = out[f"recall@{k}"] = hit.astype(np.float64)
        out[f"ndcg@{k}"] = np.where(hit, 1.0 / np.log2(ranks + 2.0), 0.0)
    return out


def _summary(ranks: np.ndarray) -> dict[str, float]:
    metrics = {m: float(v.mean()) if len(v) else 0.0 for m, v in rank_metrics(ranks).items()}
    return {**metrics, "median_rank": float(np.median(ranks)) if len(ranks) else 0.0}


def _best_interest(interests: np.ndarray, table: np.ndarray) -> Callable[[slice], np.ndarray]:
    """Users -> each item's best score over their interests (all-zero interests skipped)."""

    def scores(rows: slice) -> np.ndarray:
        block = interests[rows]  # [b, K, d]
        per = (block.reshape(-1, block.shape[2]) @ table.T).reshape(len(block), block.shape[1], -1)
        per[~np.any(block != 0, axis=2)] = -np.inf
        return per.max(axis=1)  # [b, V]

    return scores


def held_out_vectors(model: ModelArtifact, held: HeldOut) -> tuple[np.ndarray, np.ndarray]:
    """The cold-start vectors of the held-out items, float32 ``[H, d]`` (zeros for an item with no
    known attribute), and which items have one, bool ``[H]``.

    Raises:
        ValueError: a model without attribute embeddings.
    """
    if model.attribute_embeddings is None:
        raise ValueError(f"model {model.version} has no attribute embeddings (side_features attributes)")
    known = set(model.side.attributes)
    embeddable = np.array([any(a in known for a in held.attributes[i]) for i in held.items], bool)
    vectors = np.zeros((len(held.items), model.dim), np.float32)
    if embeddable.any():
        chosen = [held.attributes[i] for i, e in zip(held.items, embeddable, strict=True) if e]
        vectors[embeddable] = cold_vectors(model.side, model.attribute_embeddings, chosen, model.similarity)
    return vectors, embeddable


def random_like(vectors: np.ndarray, seed: int) -> np.ndarray:
    """Gaussian directions scaled to the mean norm of ``vectors`` ``[n, d]``, float32."""
    noise = np.random.default_rng(seed).normal(size=vectors.shape)
    scale = float(np.linalg.norm(vectors, axis=1).mean()) if len(vectors) else 0.0
    return (noise / np.linalg.norm(noise, axis=1, keepdims=True) * scale).astype(np.float32)


def evaluate_cold(model: ModelArtifact, held: HeldOut, seed: int) -> dict[str, dict[str, float]]:
    """The cold test users' metrics per method of :data:`METHODS` (see the module's protocol).

    Ids: ``1..V`` the model's items (warm), ``V + 1 + j`` the held-out item ``held.items[j]``.
    ``seed`` draws the random vectors.
    """
    warm = len(model.vocab)
    extended = {i: n + 1 for n, i in enumerate(model.vocab.ids)}
    extended.update({i: warm + 1 + j for j, i in enumerate(held.items)})
    vectors, embeddable = held_out_vectors(model, held)
    no_vector = warm + 1 + np.flatnonzero(~embeddable)
    cold = held.cold
    exclude = [np.array([*(extended[i] for i in h), *no_vector], np.int64) for h in cold.histories]
    targets = np.array([extended[t] for t in cold.targets], np.int64)
    read = [model.vocab.lookup(list(h)) for h in cold.histories]
    interests = encode_histories(model, [h[h != PAD] for h in read])  # [U, K, d]
    counts = np.zeros(warm + 1 + len(held.items), np.float64)
    counts[1 : warm + 1] = [held.counts.get(i, 0) for i in model.vocab.ids]
    picked = np.zeros_like(vectors)
    picked[embeddable] = random_like(vectors[embeddable], seed)
    tables = {
        "cold path": np.concatenate([model.item_embeddings, vectors]),
        "random vectors": np.concatenate([model.item_embeddings, picked]),
    }
    out = {
        name: _summary(target_ranks(_best_interest(interests, t), exclude, targets))
        for name, t in tables.items()
    }
    popular = target_ranks(lambda rows: np.tile(counts, (len(exclude[rows]), 1)), exclude, targets)
    out["popularity"] = _summary(popular)
    return out


# --------------------------------------------------------------------------- runs and the report


def run_folder_of(out: Path, dataset: str, tower: str, fusion: str, dropout: float, seed: int) -> Path:
    """``OUT/<dataset>/<tower>-<fusion>-iddrop<p>/seed<N>``."""
    return out / dataset / f"{tower}-{fusion}-iddrop{dropout:g}" / f"seed{seed}"


def cold_config(
    dataset: Dataset, held: HeldOut, args: argparse.Namespace, dropout: float, seed: int
) -> Config:
    """A run's configuration: ``bench.quality``'s (preset ``<dataset>-<tower>``, loo, the tower,
    fusion and attributes, seed, ``--epochs``, ``--set``) on the reduced data, then the id-dropout."""
    run = Run(
        Dataset(dataset.name, str(held.data_path), dataset.preset),
        "loo",
        args.tower,
        args.fusion,
        "attributes",
        seed,
    )
    return run_config(run, args.epochs, [*args.set, f"model.id_dropout={dropout}"])


def aggregate(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, id-dropout): the seeds, and mean and std over them of every cold and warm metric."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["id_dropout"]), []).append(r)
    out = []
    for (dataset, dropout), members in groups.items():
        flat: dict[str, list[float]] = {}
        for r in members:
            values = {f"cold/{m}/{k}": v for m, ms in r["cold"].items() for k, v in ms.items()}
            values.update({f"warm/{k}": v for k, v in r["warm"].items()})
            values["train_seconds"] = r["train_seconds"]
            for k, v in values.items():
                flat.setdefault(k, []).append(float(v))
        stats = {k: mean_std(v) for k, v in flat.items()}
        out.append(
            {
                "dataset": dataset,
                "id_dropout": dropout,
                "seeds": [r["seed"] for r in members],
                "mean": {k: m for k, (m, _) in stats.items()},
                "std": {k: s for k, (_, s) in stats.items()},
            }
        )
    return out


_LABELS = {"recall@50": "Recall@50", "hr@50": "HR@50 (= Recall@50)", "ndcg@50": "NDCG@50"}


def _header(columns: Sequence[str], *extra: str) -> list[str]:
    names = [_LABELS.get(c, c.replace("hr", "HR").replace("ndcg", "NDCG")) for c in columns]
    return ["ranking", "id_dropout", "seeds", *names, *extra]


def cold_table(groups: Sequence[Mapping[str, Any]]) -> str:
    """One dataset's held-out targets: cold path and random vectors per id-dropout, then
    popularity (the same for every run)."""
    rows = []
    for g in groups:
        for method in METHODS[:2]:
            keys = [f"cold/{method}/{c}" for c in (*COLUMNS, "median_rank")]
            cells = [mean_cell(g["mean"][k], g["std"][k], 0 if k.endswith("rank") else 4) for k in keys]
            rows.append([method, f"{g['id_dropout']:g}", str(len(g["seeds"])), *cells])
    first = groups[0]
    cells = [mean_cell(first["mean"][f"cold/popularity/{c}"], None, 4) for c in COLUMNS]
    rank = mean_cell(first["mean"]["cold/popularity/median_rank"], None, 0)
    rows.append(["popularity (held-out count 0)", "–", "–", *cells, rank])
    return "\n".join(markdown_table(_header(COLUMNS, "median rank"), rows))


def warm_table(groups: Sequence[Mapping[str, Any]], popularity: Mapping[str, float]) -> str:
    """One dataset's warm test (leave-one-out on the reduced data) per id-dropout, and popularity."""
    rows = []
    for g in groups:
        cells = [mean_cell(g["mean"][f"warm/{c}"], g["std"][f"warm/{c}"]) for c in WARM_COLUMNS]
        seconds = mean_cell(g["mean"]["train_seconds"], g["std"]["train_seconds"], 0)
        rows.append(["model", f"{g['id_dropout']:g}", str(len(g["seeds"])), *cells, seconds])
    rows.append(["popularity", "–", "–", *(mean_cell(popularity.get(c), None) for c in WARM_COLUMNS), "–"])
    return "\n".join(markdown_table(_header(WARM_COLUMNS, "train s"), rows))


def markdown(report: Mapping[str, Any]) -> str:
    """``results.md``: where and how it ran, then per dataset its cold and warm tables."""
    meta = report["meta"]
    lines = measured(meta)
    for name, info in report["datasets"].items():
        groups = [g for g in report["groups"] if g["dataset"] == name]
        if not groups:
            continue
        lines += [
            "",
            f"### {name}: held-out targets ({info['cold_users']} users whose last item is one of the "
            f"{info['held_out']} held-out items)",
            "",
            f"{info['dropped_users']} more such users had no warm item in their history (left out); "
            f"held-out items without a known attribute (never retrieved): {info['without_vector']}.",
            "",
            cold_table(groups),
            "",
            f"### {name}: warm items (leave-one-out on the reduced data, {info['warm_users']} test users)",
            "",
            warm_table(groups, info["warm_popularity"]),
        ]
    return "\n".join(lines) + "\n"


def write_report(
    out: Path, meta: dict[str, Any], records: Sequence[Mapping[str, Any]], datasets: Mapping[str, Any]
) -> dict[str, Any]:
    """Writes ``results.json`` and ``results.md`` into ``out``; returns the report."""
    meta["load_end"] = load_average(2)
    report = {"meta": meta, "datasets": dict(datasets), "runs": list(records), "groups": aggregate(records)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))
    return report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--datasets", nargs="+", default=["beauty", "sports"], help="names or paths (with attributes)"
    )
    add_data_root_argument(p)
    p.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS), help="training seeds")
    p.add_argument(
        "--id-dropout", nargs="+", type=float, default=list(DROPOUTS), help="model.id_dropout values"
    )
    p.add_argument("--hold-out", type=float, default=HOLD_OUT, help="share of the items held out")
    p.add_argument("--split-seed", type=int, default=SPLIT_SEED, help="seed of the held-out items")
    sided = [t for t in tower_names() if takes_side_information(t)]
    p.add_argument("--tower", choices=sided, default="sasrec")
    p.add_argument("--fusion", choices=[f for f in FUSIONS if f != "none"], default="nova")
    p.add_argument("--epochs", type=int, help="every run's train.epochs (default: the preset's)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="for every run")
    p.add_argument("--out", type=Path, default=Path("runs/cold-start"), help="results and runs")
    p.add_argument("--quiet", action="store_true", help="no Keras progress output")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The command (``python -m bench.cold_start``)."""
    args = parse_args(argv)
    meta: dict[str, Any] = {
        **run_meta(f"python -m bench.cold_start {shlex.join(args.argv)}"),
        "hold_out": args.hold_out,
        "split_seed": args.split_seed,
    }
    records: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    try:
        resolved = [resolve_dataset(d, 0, args.out, args.data_root) for d in args.datasets]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for dataset in resolved:
        held = hold_out(dataset.path, args.hold_out, args.split_seed, args.out / dataset.name / "data")
        datasets[dataset.name] = _dataset_info(held)
        for dropout in args.id_dropout:
            for seed in args.seeds:
                records.append(_one_run(dataset, held, args, dropout, seed))
                datasets[dataset.name]["without_vector"] = records[-1]["without_vector"]
                datasets[dataset.name]["warm_popularity"] = records[-1]["warm_popularity"]
                write_report(args.out, meta, records, datasets)
    report = write_report(args.out, meta, records, datasets)
    print("\n" + markdown(report))
    print(f"written to {args.out}")
    return 0


def _dataset_info(held: HeldOut) -> dict[str, Any]:
    return {
        "data": str(held.data_path),
        "held_out": len(held.items),
        "cold_users": len(held.cold.users),
        "dropped_users": held.cold.dropped,
        "warm_users": held.warm_users,
    }


def _one_run(
    dataset: Dataset, held: HeldOut, args: argparse.Namespace, dropout: float, seed: int
) -> dict[str, Any]:
    """Trains (or reads back) one run and scores its cold and warm test users."""
    config = cold_config(dataset, held, args, dropout, seed)
    folder = run_folder_of(args.out, dataset.name, args.tower, args.fusion, dropout, seed)
    print(f"\n=== {folder}", flush=True)
    metrics, how = run_one(config, folder, verbose=0 if args.quiet else 2)
    model = load_model(folder)
    vectors, embeddable = held_out_vectors(model, held)
    norms = {  # a cold vector much shorter than the warm ones rarely outscores them
        "warm": float(np.linalg.norm(model.item_embeddings[1:], axis=1).mean()),
        "cold": float(np.linalg.norm(vectors[embeddable], axis=1).mean()) if embeddable.any() else 0.0,
    }
    return {
        "dataset": dataset.name,
        "id_dropout": dropout,
        "seed": seed,
        "folder": str(folder),
        "obtained": how,
        "train_seconds": metrics["train_seconds"],
        "epochs_trained": metrics["epochs_trained"],
        "without_vector": int((~embeddable).sum()),
        "mean_norm": norms,
        "cold": evaluate_cold(model, held, seed),
        "warm": {k: metrics["test"][k] for k in WARM_COLUMNS},
        "warm_popularity": {k: metrics["baseline_popularity_test"][k] for k in WARM_COLUMNS},
    }


if __name__ == "__main__":
    sys.exit(main())
