"""Retrieval quality: towers × datasets × protocols × seeds, trained, evaluated and reported.

    python -m bench.quality --datasets beauty --towers sasrec sa --seeds 42 43 44
    python -m bench.quality --datasets beauty ml100k --protocols loo comirec --epochs 30
    python -m bench.quality --datasets beauty --towers sasrec --fusions none nova sum gated concat
    python -m bench.quality --quick                      # smoke run: ML-100K's first 200 users

Datasets are names (``ml100k``, ``beauty``, ``sports``: ``retrieval.data.DATASETS``, under
``--data-root``, default ``$MITT_DATA`` or ``../shared/data``) or paths; ``--max-users N`` trains
on a slice of each (:func:`slice_dataset`). Every (dataset, protocol, tower, fusion, seed) is one
training run and one model artifact folder, ``OUT/<dataset>/<protocol>/<tower>-<fusion>/seed<N>``
(or under ``--runs``, so that the reports of several commands, each in its own ``--out``, share
their common runs). A run starts from the preset ``<dataset>-<tower>``
(``retrieval/training/presets.py``) when there is one, else the tower's own (a path: ``<tower>``,
as ``mitt train`` without ``--preset``), then takes the protocol,
tower, fusion, seed, ``--epochs`` and every ``--set``. A finished run is read back (its saved
configuration must be the one asked for), an interrupted one resumes from its last epoch's
checkpoint, so the benchmark continues where it stopped.

Seeds vary training only (weights, data order, negatives, dropout): the split is the same for
every seed. The report covers the runs of the command given. Writes into ``--out``
(``results.json`` and ``results.md`` after every run, the plots at the end):

* ``results.json``: every run's ``metrics.json``, the mean and sample standard deviation of each
  test metric over the seeds of every (dataset, protocol, tower, fusion), and the most-popular
  baseline of every dataset × protocol;
* ``results.md``: one table per dataset × protocol (the protocol's headline metrics, mean ± std,
  training seconds, the popularity baseline), under the date, commit, command and load average;
  then, per dataset × protocol with several towers/fusions, the paired differences against a
  reference (``--reference``, default the first): every run's test metrics are recomputed per
  user from its saved model, averaged over its seeds, and each other row's per-user difference
  to the reference is averaged over the users with its standard error (:func:`paired`). The
  seeds' std says how much training varies; this error says whether the test users can tell
  two rows apart at all;
* ``recall_at_k.png``: HR@K (leave-one-out) or Recall@K (ComiRec) for every K measured, one line
  per tower/fusion; ``training_curves.png``: validation metric and training loss per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np

from bench.context import load_average, measured, run_meta
from bench.data import add_data_root_argument, dataset_file
from bench.markdown import mean_cell
from bench.markdown import table as markdown_table
from retrieval.artifacts import load_model
from retrieval.config import apply_overrides
from retrieval.data import DATASETS, load_interactions
from retrieval.evaluation import USER_METRICS_FILE, UserMetrics, compare_user_metrics
from retrieval.training import (
    Config,
    InMemoryData,
    get_preset,
    preset_for,
    run_folder,
    takes_side_information,
    tower_fusions,
    train,
)
from towers import tower_names
from towers.side import FUSIONS

PROTOCOLS = ("loo", "loo-refit", "comirec")
DEFAULT_SEEDS = (42, 43, 44)
"""Three seeds, the first the default ``train.seed`` (so seed 42 is the plain ``tools/train.py`` run)."""
QUICK_TOWERS = ("youtubednn", "sasrec")
QUICK_MAX_USERS = 200
QUICK_SETS = ("model.dim=16", "model.max_len=20", "train.num_negatives=20")
"""``--quick``'s small models, applied before ``--set``."""

COLUMNS = {
    "loo": ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "hr@50", "ndcg@50"),
    "loo-refit": ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "hr@50", "ndcg@50"),
    "comirec": (
        "recall@20",
        "recall@50",
        "hitrate@20",
        "hitrate@50",
        "ndcg@50",
        "diversity@20",
        "diversity@50",
    ),
}
"""Each protocol's headline test metrics, the table's columns (those measured)."""
TITLES = {
    "loo": "leave-one-out, full ranking, history excluded",
    "loo-refit": "leave-one-out, full ranking, history excluded; trained on the validation events too",
    "comirec": "ComiRec's protocol (users 8:1:1, 80% history / 20% targets)",
}
CURVE = {"loo": "hr", "loo-refit": "hr", "comirec": "recall"}
"""The metric of the Recall@K plot: leave-one-out has one target, so its HR@K is its Recall@K."""
MONITOR = {"loo": "ndcg@10", "loo-refit": "ndcg@10", "comirec": "recall@50"}
"""The validation metric of the training curves (the one early stopping watches; loo-refit has none)."""
LABELS = {"hr": "HR", "hitrate": "HR", "ndcg": "NDCG", "recall": "Recall", "diversity": "Diversity"}


@dataclass(frozen=True)
class Dataset:
    """A dataset of the benchmark.

    Attributes:
        name: its folder under ``--out`` and its name in the report.
        path: the interactions the runs read.
        preset: the key of :data:`retrieval.data.DATASETS` it was named by, or None (a path).
    """

    name: str
    path: str
    preset: str | None = None


@dataclass(frozen=True)
class Run:
    """One training run: a dataset, a protocol, a tower with a fusion mode, a seed, and under the
    ComiRec protocol with ``folds`` > 1 the test fold."""

    dataset: Dataset
    protocol: str
    tower: str
    fusion: str
    side_features: str
    seed: int
    folds: int = 1
    fold: int = 0

    @property
    def preset(self) -> str:
        """The preset the run starts from: ``<dataset>-<tower>`` when it exists, else ``<tower>``."""
        return preset_for(self.dataset.preset, self.tower)

    def folder(self, out: Path) -> Path:
        """The run's model artifact folder: ``.../seed<N>``, or ``.../seed<N>-fold<i>of<folds>``."""
        name = f"seed{self.seed}" + (f"-fold{self.fold}of{self.folds}" if self.folds > 1 else "")
        return out / self.dataset.name / self.protocol / f"{self.tower}-{self.fusion}" / name


def slice_dataset(source: str, max_users: int, folder: Path) -> str:
    """The events of ``source``'s first ``max_users`` users (in order of first appearance),
    written into ``folder`` in a format that keeps what the source has; returns the file.

    A source whose timestamps are only positions (S3-Rec files) becomes ``folder/data.txt``, an
    S3-Rec file with the item attributes in ``data_item2attributes.json`` beside it; any other
    becomes ``folder/data.csv``, a ``user,item,timestamp`` table with every side column (e.g.
    ``rating``) and the titles, but not the item attributes, which tables do not carry.
    """
    data = load_interactions(source)
    users = data.events["user"].unique()[:max_users]
    events = data.events[data.events["user"].isin(users)]
    folder.mkdir(parents=True, exist_ok=True)
    if not data.has_time:
        path = folder / "data.txt"
        lines = [" ".join([user, *group["item"]]) for user, group in events.groupby("user", sort=False)]
        path.write_text("\n".join(lines) + "\n")
        if "attributes" in data.items.columns:
            kept = data.items[data.items["item"].isin(events["item"]) & data.items["attributes"].notna()]
            attributes = dict(zip(kept["item"], map(list, kept["attributes"]), strict=True))
            (folder / "data_item2attributes.json").write_text(json.dumps(attributes))
        return str(path)
    path = folder / "data.csv"
    if "title" in data.items.columns:
        events = events.merge(data.items[["item", "title"]], on="item", how="left")
    events.to_csv(path, index=False)
    return str(path)


def resolve_dataset(spec: str, max_users: int, out: Path, root: Path | None = None) -> Dataset:
    """A dataset name (``ml100k``, ``beauty``, ``sports``, read from the data ``root``, default
    :func:`bench.data.default_data_root`) or a path. With ``max_users``, the dataset is the slice
    :func:`slice_dataset` writes into ``OUT/<name>/``, where ``<name>`` ends with
    ``-<max_users>users``."""
    preset = spec if spec in DATASETS else None
    path = dataset_file(spec, root) if preset else Path(spec).resolve()
    if not path.exists():
        raise ValueError(f"dataset {spec!r}: {path} does not exist")
    name = preset or (path.stem if path.suffix else path.name)
    if not max_users:
        return Dataset(name, str(path), preset)
    name = f"{name}-{max_users}users"
    return Dataset(name, slice_dataset(str(path), max_users, (out / name).resolve()), preset)


def plan(
    datasets: Sequence[Dataset],
    protocols: Sequence[str],
    towers: Sequence[str],
    fusions: Sequence[str],
    side_features: str,
    seeds: Sequence[int],
    fusion_towers: Sequence[str] | None = None,
    folds: int = 1,
) -> list[Run]:
    """Every run, in the order they are trained: by dataset, protocol, tower, fusion, seed, then fold.

    Under the ``comirec`` protocol each seed runs ``folds`` test folds (one run, the single
    8:1:1 split, when ``folds`` is 1); leave-one-out tests every user already and runs once.
    Each of ``fusion_towers`` (default: every tower of ``towers`` that reads side information,
    :func:`retrieval.training.model.takes_side_information`) runs each of ``fusions``, the modes other
    than ``none`` with ``side_features``; every other tower runs ``none`` only.

    Raises:
        ValueError: a fusion mode without side features, or a fusion tower that reads none.
    """
    if fusion_towers is None:
        fusion_towers = [t for t in towers if takes_side_information(t)]
    refused = [t for t in fusion_towers if not takes_side_information(t)]
    if refused:
        raise ValueError(f"tower(s) {', '.join(refused)} take no side information (no fusion modes)")
    if not side_features and any(f != "none" for f in fusions) and fusion_towers:
        raise ValueError(f"fusion modes {', '.join(f for f in fusions if f != 'none')} need --side-features")
    runs = []
    for dataset in datasets:
        for protocol in protocols:
            for tower in towers:
                # Each fusion tower runs the modes asked that it takes (fmlprec: no nova).
                taken = [f for f in fusions if f in tower_fusions(tower)]
                for fusion in taken if tower in fusion_towers else ["none"]:
                    side = side_features if fusion != "none" else ""
                    n = folds if protocol == "comirec" else 1
                    runs += [
                        Run(dataset, protocol, tower, fusion, side, seed, n, fold)
                        for seed in seeds
                        for fold in range(n)
                    ]
    return runs


def run_config(run: Run, epochs: int | None, overrides: Sequence[str]) -> Config:
    """The run's configuration: defaults, its preset's overrides (not its data path: the run has its
    own), the run's own fields, ``--epochs``, ``--set``."""
    config = apply_overrides(Config(), get_preset(run.preset).overrides)
    own = [
        f"data.path={run.dataset.path}",
        f"data.protocol={run.protocol}",
        f"model.tower={run.tower}",
        f"model.fusion={run.fusion}",
        f"model.side_features={run.side_features}",
        f"train.seed={run.seed}",
        f"data.folds={run.folds}",
        f"data.fold={run.fold}",
        *([f"train.epochs={epochs}"] if epochs is not None else []),
    ]
    return apply_overrides(config, [*own, *overrides])


def refit_budget(run: Run, config: Config, root: Path, overrides: Sequence[str]) -> Config:
    """A ``loo-refit`` run's budget: it has no validation to stop on, so unless ``--epochs`` or
    ``--set train.max_steps=`` gives one, it trains the ``best_step`` of its ``loo`` twin (same
    dataset, tower, fusion and seed, under ``root``), which must be finished first (``loo``
    before ``loo-refit`` in ``--protocols``, or an earlier command's run under ``--runs``).

    Raises:
        ValueError: no finished ``loo`` twin, or one without a best step.
    """
    given = any(o.startswith("train.max_steps=") for o in overrides)
    if run.protocol != "loo-refit" or config.train.epochs is not None or given:
        return config
    twin = dataclasses.replace(run, protocol="loo").folder(root) / "metrics.json"
    if not twin.is_file():
        raise ValueError(
            f"{run.folder(root)}: a loo-refit run trains its loo run's best step, and {twin} does not "
            "exist: add loo before loo-refit to --protocols, or give --epochs or --set train.max_steps=N"
        )
    best = json.loads(twin.read_text()).get("best_step")
    if not best:
        raise ValueError(f"{twin} records no best step (no early stopping): give --set train.max_steps=N")
    return apply_overrides(config, [f"train.max_steps={best}"])


def _differences(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """``field: saved -> given`` for every configuration field that differs."""
    flat = [{f"{s}.{k}": v for s, fields in c.items() for k, v in fields.items()} for c in (saved, given)]
    keys = sorted(set(flat[0]) | set(flat[1]))
    return [
        f"{k}: {flat[0].get(k)!r} -> {flat[1].get(k)!r}" for k in keys if flat[0].get(k) != flat[1].get(k)
    ]


def finished(config: Config, out: Path) -> bool:
    """Whether ``out`` is the finished artifact of ``config``.

    Raises:
        ValueError: ``out`` holds a finished run of another configuration.
    """
    if not (out / "metrics.json").is_file():
        return False
    # Read through Config so that a field added since the run was saved takes its default.
    saved = Config.from_dict(json.loads((out / "config.json").read_text())).to_dict()
    differ = _differences(saved, config.to_dict())
    if differ:
        raise ValueError(
            f"{out} holds a finished run of another configuration ({'; '.join(differ)}): "
            "remove it or choose another --out"
        )
    return True


def run_one(config: Config, out: Path, verbose: int = 2) -> tuple[dict[str, Any], str]:
    """One run's metrics and how they were obtained: ``read`` (the finished artifact of this very
    configuration, :func:`finished`), ``resumed`` (from the checkpoint of an interrupted run) or
    ``trained``."""
    if finished(config, out):
        return json.loads((out / "metrics.json").read_text()), "read"
    resume = run_folder(out).is_dir()
    metrics = train(config, out, verbose=verbose, resume=resume).to_dict()
    keras.backend.clear_session()  # each run builds new graphs: drop the previous run's
    return metrics, "resumed" if resume else "trained"


def user_test_metrics(config: Config, folder: Path, data: dict[tuple[Any, ...], InMemoryData]) -> UserMetrics:
    """A finished run's test metrics per user (:meth:`InMemoryData.user_metrics`, exact search
    with its saved model), by external user id. Kept in the run folder as
    ``user_metrics.csv`` (:data:`retrieval.evaluation.USER_METRICS_FILE`) and read from there
    while it is newer than the run's ``metrics.json``. ``data`` caches the loaded datasets (by
    what the split and the features depend on)."""
    kept = folder / USER_METRICS_FILE
    if kept.is_file() and kept.stat().st_mtime >= (folder / "metrics.json").stat().st_mtime:
        return UserMetrics.load(kept)
    d = config.data
    key = (d.path, d.format, d.protocol, d.split_seed, d.folds, d.fold, config.model.side_features)
    if key not in data:
        data[key] = InMemoryData(config)
    values = data[key].user_metrics(load_model(folder), "test")
    result = UserMetrics(tuple(data[key].rules.held_out_ids("test")), values)
    result.save(kept)
    return result


# --------------------------------------------------------------------------- aggregation


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (``ddof = 1``; None for a single value)."""
    x = np.asarray(values, np.float64)
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else None


def pool_folds(
    records: Sequence[Mapping[str, Any]], per_user: Sequence[UserMetrics]
) -> tuple[list[dict[str, Any]], list[UserMetrics]]:
    """One record per (dataset, protocol, tower, fusion, seed): the test folds of a seed pooled.

    A pooled record's test metrics and popularity baseline are means over the users of all its
    folds (each fold's mean weighted by its test users: every metric, diversity included, is a
    mean over users), its ``train_seconds`` the folds' sum, ``folds_pooled`` the folds in it; its
    per-user values are the folds' together. A run without folds is kept as it is.

    Args:
        records: the runs, as :func:`train_and_report` records them (``fold``, ``folds``).
        per_user: each run's :func:`user_test_metrics`, aligned with ``records``.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((r["dataset"], r["protocol"], r["tower"], r["fusion"], r["seed"]), []).append(i)
    pooled_records, pooled_users = [], []
    for members in groups.values():
        first = records[members[0]]
        if first.get("folds", 1) == 1:
            pooled_records += [dict(records[i]) for i in members]
            pooled_users += [per_user[i] for i in members]
            continue
        weights = [len(per_user[i].users) for i in members]

        def pooled(key: str, members: list[int] = members, weights: list[int] = weights) -> dict[str, float]:
            runs = [records[i]["metrics"][key] for i in members]
            names = [m for m in runs[0] if all(m in r for r in runs)]
            return {m: float(np.average([r[m] for r in runs], weights=weights)) for m in names}

        metrics = {
            "test": pooled("test"),
            "baseline_popularity_test": pooled("baseline_popularity_test"),
            "train_seconds": float(sum(records[i]["metrics"]["train_seconds"] for i in members)),
        }
        folds = [records[i]["fold"] for i in members]
        pooled_records.append({**first, "fold": None, "folds_pooled": folds, "metrics": metrics})
        pooled_users.append(UserMetrics.concat([per_user[i] for i in members]))
    return pooled_records, pooled_users


def aggregate(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, protocol, tower, fusion), in order of first appearance: the seeds and the
    mean and std over them of every test metric and of ``train_seconds``."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["protocol"], r["tower"], r["fusion"]), []).append(r)
    out = []
    for (dataset, protocol, tower, fusion), members in groups.items():
        values: dict[str, list[float]] = {}
        for r in members:
            for k, v in {**r["metrics"]["test"], "train_seconds": r["metrics"]["train_seconds"]}.items():
                values.setdefault(k, []).append(float(v))
        stats = {k: mean_std(v) for k, v in values.items() if len(v) == len(members)}
        out.append(
            {
                "dataset": dataset,
                "protocol": protocol,
                "tower": tower,
                "fusion": fusion,
                "side_features": members[0]["side_features"],
                "seeds": [r["seed"] for r in members],
                "mean": {k: m for k, (m, _) in stats.items()},
                "std": {k: s for k, (_, s) in stats.items()},
            }
        )
    return out


def _name(record: Mapping[str, Any]) -> str:
    return f"{record['tower']}-{record['fusion']}"


def paired(
    records: Sequence[Mapping[str, Any]],
    per_user: Sequence[UserMetrics],
    reference: str | None = None,
) -> list[dict[str, Any]]:
    """Per dataset × protocol with two or more towers/fusions: each against the reference on the
    same test users.

    Per user, a row's value of a metric is its mean over the row's seeds; a row's difference is
    the mean over the users of (row − reference), with its standard error, 95% interval and
    the relative change (:func:`retrieval.evaluation.paired_comparison`), users paired by id.

    Args:
        records: the runs (``dataset``, ``protocol``, ``tower``, ``fusion``, ``seed``), folds
            pooled (:func:`pool_folds`).
        per_user: each run's per-user test metrics, aligned with ``records``.
        reference: ``<tower>-<fusion>`` (``sasrec-none``); None or absent from a dataset ×
            protocol = its first row.

    Returns:
        ``[{"dataset", "protocol", "reference", "users", "reference_mean", "reference_se",
        "rows": [{"tower", "fusion", "seeds", "difference": {metric: …}, "se", "low", "high",
        "relative", "relative_se"}]}]``; ``reference_se`` is the reference's own standard error
        over the users.
    """
    out = []
    for key in dict.fromkeys((r["dataset"], r["protocol"]) for r in records):
        rows: dict[str, list[int]] = {}
        for i, r in enumerate(records):
            if (r["dataset"], r["protocol"]) == key:
                rows.setdefault(_name(r), []).append(i)
        if len(rows) < 2:
            continue
        means = {name: UserMetrics.average([per_user[i] for i in members]) for name, members in rows.items()}
        ref = reference if reference in rows else next(iter(rows))
        entry: dict[str, Any] = {
            "dataset": key[0],
            "protocol": key[1],
            "reference": ref,
            "users": len(means[ref].users),
            "reference_mean": means[ref].means(),
            "reference_se": {m: float(v.std(ddof=1) / np.sqrt(len(v))) for m, v in means[ref].values.items()},
            "rows": [],
        }
        for name, members in rows.items():
            if name == ref:
                continue
            comparison = compare_user_metrics(means[name], means[ref])
            first = records[members[0]]
            fields = ("difference", "se", "low", "high", "relative", "relative_se")
            entry["rows"].append(
                {
                    "tower": first["tower"],
                    "fusion": first["fusion"],
                    "seeds": [records[i]["seed"] for i in members],
                    **{f: {m: getattr(c, f) for m, c in comparison.items()} for f in fields},
                }
            )
        out.append(entry)
    return out


def baselines(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The most-popular baseline per dataset × protocol (the same split for every run of it)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        seen.setdefault(
            (r["dataset"], r["protocol"]),
            {
                "dataset": r["dataset"],
                "protocol": r["protocol"],
                "test": r["metrics"]["baseline_popularity_test"],
            },
        )
    return list(seen.values())


# --------------------------------------------------------------------------- the report


def _label(metric: str) -> str:
    family, _, k = metric.partition("@")
    return f"{LABELS.get(family, family)}@{k}"


def tables(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(dataset, protocol, Markdown table)`` per dataset × protocol of the report's groups:
    the popularity baseline, then one row per tower/fusion."""
    out = []
    for key in dict.fromkeys((g["dataset"], g["protocol"]) for g in report["groups"]):
        groups = [g for g in report["groups"] if (g["dataset"], g["protocol"]) == key]
        baseline: Mapping[str, float] = next(
            (b["test"] for b in report["baselines"] if (b["dataset"], b["protocol"]) == key), {}
        )
        columns = [c for c in COLUMNS[key[1]] if any(c in g["mean"] for g in groups)]
        header = ["tower", "fusion (side information)", "seeds", *map(_label, columns), "train s"]
        rows = []
        if baseline:
            rows.append(["most popular", "–", "–", *(mean_cell(baseline.get(c), None) for c in columns), "–"])
        for g in groups:
            fusion = g["fusion"] if g["fusion"] == "none" else f"{g['fusion']} ({g['side_features']})"
            cells = [mean_cell(g["mean"].get(c), g["std"].get(c)) for c in columns]
            seconds = mean_cell(g["mean"]["train_seconds"], g["std"]["train_seconds"], 0)
            rows.append([f"`{g['tower']}`", fusion, str(len(g["seeds"])), *cells, seconds])
        out.append((key[0], key[1], "\n".join(markdown_table(header, rows))))
    return out


def _signed(difference: float, se: float, relative: float, digits: int = 4) -> str:
    cell = f"{difference:+.{digits}f} ± {se:.{digits}f}"
    cell = f"**{cell}**" if abs(difference) > 2 * se else cell
    return cell if np.isnan(relative) else f"{cell} ({relative:+.1%})"


def paired_table(entry: Mapping[str, Any]) -> str:
    """The Markdown table of one :func:`paired` entry: the reference's mean ± its standard error
    over the users, then each row's difference ± its standard error (bold beyond 2 errors)."""
    columns = [c for c in COLUMNS[entry["protocol"]] if c in entry["reference_mean"]]
    header = ["tower", "fusion", "seeds", *map(_label, columns)]
    tower, _, fusion = entry["reference"].partition("-")
    cells = [f"{entry['reference_mean'][c]:.4f} ± {entry['reference_se'][c]:.4f}" for c in columns]
    rows = [[f"`{tower}` (reference)", fusion, "–", *cells]]
    for row in entry["rows"]:
        cells = [_signed(row["difference"][c], row["se"][c], row["relative"][c]) for c in columns]
        rows.append([f"`{row['tower']}`", row["fusion"], str(len(row["seeds"])), *cells])
    return "\n".join(markdown_table(header, rows))


def markdown(report: Mapping[str, Any]) -> str:
    """``results.md``: where and how it was measured, then :func:`tables`."""
    meta = report["meta"]
    lines = [
        *measured(meta),
        "",
        "Test split. Each cell is the mean ± sample standard deviation over the seeds (`seeds`: how "
        "many; they vary training only, the split is fixed). `train s`: training wall seconds, the "
        "per-epoch validation included. Each run's `metrics.json` is in "
        f"`{meta['runs']}/<dataset>/<protocol>/<tower>-<fusion>/seed<N>/` (`seed<N>-fold<i>of<folds>/` "
        "for a test fold), with its per-user test metrics `user_metrics.csv` and its resolved "
        "`config.json`: its preset `<dataset>-<tower>` (`retrieval/training/presets.py`; none for a dataset "
        "given as a path), then the protocol, tower, fusion, seed, `--epochs` and every `--set`.",
    ]
    comparisons = {(p["dataset"], p["protocol"]): p for p in report.get("paired", [])}
    folds = meta.get("folds", 1)
    for dataset, protocol, table in tables(report):
        title = TITLES[protocol]
        if protocol == "comirec" and folds > 1:
            title += f", {folds} test folds pooled: every user tested once"
        lines += ["", f"### {dataset}: {title}", "", table]
        entry = comparisons.get((dataset, protocol))
        if entry is not None:
            lines += [
                "",
                f"Paired against `{entry['reference']}` on the same {entry['users']} test users: per "
                "user, each row's metric is averaged over its seeds; a cell is the mean over the users "
                "of (row − reference) ± its standard error, **bold** beyond 2 errors, then the "
                "relative change (row mean / reference mean − 1; the 95% intervals are in "
                "`results.json` and `python -m bench.paired`). The reference row is its mean ± its "
                "own standard error over the users.",
                "",
                paired_table(entry),
            ]
    return "\n".join(lines) + "\n"


def _panels(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((g["dataset"], g["protocol"]) for g in report["groups"]))


def plot_recall_at_k(report: Mapping[str, Any], path: Path) -> None:
    """HR@K or Recall@K (:data:`CURVE`) against K, per dataset × protocol: one line per
    tower/fusion (mean over seeds, std as error bars) and the popularity baseline dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = _panels(report)
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax, (dataset, protocol) in zip(axes.flat, panels, strict=False):
        family = CURVE[protocol]

        def ks(metrics: Mapping[str, Any], family: str = family) -> list[int]:
            return sorted(int(m.split("@")[1]) for m in metrics if m.split("@")[0] == family)

        for g in report["groups"]:
            if (g["dataset"], g["protocol"]) != (dataset, protocol):
                continue
            k = ks(g["mean"])
            std = [g["std"][f"{family}@{x}"] or 0.0 for x in k]
            label = g["tower"] if g["fusion"] == "none" else f"{g['tower']} {g['fusion']}"
            ax.errorbar(
                k, [g["mean"][f"{family}@{x}"] for x in k], yerr=std, marker="o", capsize=3, label=label
            )
        for b in report["baselines"]:
            if (b["dataset"], b["protocol"]) == (dataset, protocol) and ks(b["test"]):
                k = ks(b["test"])
                ax.plot(k, [b["test"][f"{family}@{x}"] for x in k], "k--", marker=".", label="most popular")
        ax.set_xscale("log")
        measured = sorted(
            {
                x
                for g in report["groups"]
                if (g["dataset"], g["protocol"]) == (dataset, protocol)
                for x in ks(g["mean"])
            }
        )
        ax.set_xticks(measured, [str(x) for x in measured])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.set_xlabel("K")
        ax.set_ylabel(f"test {LABELS[family]}@K" + (" (= Recall@K)" if protocol.startswith("loo") else ""))
        ax.set_title(f"{dataset}, {protocol}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_training_curves(report: Mapping[str, Any], path: Path) -> None:
    """Per dataset × protocol, the validation metric (:data:`MONITOR`) and the training loss per
    epoch of every run (``validation_per_epoch``, ``train_loss_per_epoch``), a colour per
    tower/fusion, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = _panels(report)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (val_ax, loss_ax), (dataset, protocol) in zip(axes, panels, strict=True):
        monitor = MONITOR[protocol]
        groups = [g for g in report["groups"] if (g["dataset"], g["protocol"]) == (dataset, protocol)]
        for i, g in enumerate(groups):
            colour = colours[i % len(colours)]
            label = g["tower"] if g["fusion"] == "none" else f"{g['tower']} {g['fusion']}"
            members = [
                r
                for r in report["runs"]
                if (r["dataset"], r["protocol"], r["tower"], r["fusion"])
                == (dataset, protocol, g["tower"], g["fusion"])
            ]
            for j, r in enumerate(members):
                history = [h for h in r["metrics"].get("validation_per_epoch", []) if monitor in h]
                losses = r["metrics"].get("train_loss_per_epoch", [])
                name = label if j == 0 else None
                val_ax.plot(
                    [h["epoch"] for h in history],
                    [h[monitor] for h in history],
                    color=colour,
                    marker=".",
                    alpha=0.8,
                    label=name,
                )
                loss_ax.plot(
                    range(1, len(losses) + 1), losses, color=colour, marker=".", alpha=0.8, label=name
                )
        val_ax.set_ylabel(f"validation {_label(monitor)}")
        loss_ax.set_ylabel("training loss")
        if not any(len(line.get_xdata()) for line in val_ax.lines):  # loo-refit: nothing validated
            val_ax.text(0.5, 0.5, "no validation: trained on\nthe validation events too", ha="center",
                        va="center", transform=val_ax.transAxes)  # fmt: skip
            val_ax.set_yticks([])
            val_ax.set_xlim(loss_ax.get_xlim())
        for ax in (val_ax, loss_ax):
            ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
            ax.set_xlabel("epoch")
            ax.set_title(f"{dataset}, {protocol}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_user_metrics(
    out: Path, records: Sequence[Mapping[str, Any]], per_user: Sequence[UserMetrics]
) -> None:
    """``OUT/users/<dataset>/<protocol>/<tower>-<fusion>.csv``: per test user (folds pooled), each
    metric averaged over the row's seeds: what ``python -m bench.paired`` compares across reports."""
    rows: dict[tuple[str, str, str], list[UserMetrics]] = {}
    for record, users in zip(records, per_user, strict=True):
        rows.setdefault((record["dataset"], record["protocol"], _name(record)), []).append(users)
    for (dataset, protocol, name), parts in rows.items():
        path = out / "users" / dataset / protocol / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        UserMetrics.average(parts).save(path)


def write_report(
    out: Path,
    meta: dict[str, Any],
    records: Sequence[Mapping[str, Any]],
    plots: bool,
    per_user: Sequence[UserMetrics],
    reference: str | None = None,
) -> dict[str, Any]:
    """Writes ``results.json``, ``results.md``, the per-user files (:func:`write_user_metrics`)
    and, with ``plots``, the two PNGs; returns the report.

    The tables and the :func:`paired` comparisons against ``reference`` (``per_user``: each
    run's :func:`user_test_metrics`) cover the seeds whose test folds are all done, each pooled
    over its folds (:func:`pool_folds`); ``runs`` lists every run, fold by fold.
    """
    meta["load_end"] = load_average(2)
    pooled, pooled_users = pool_folds(records, per_user)
    done = [i for i, r in enumerate(pooled) if len(r.get("folds_pooled", [0])) == r.get("folds", 1)]
    pooled, pooled_users = [pooled[i] for i in done], [pooled_users[i] for i in done]
    report = {
        "meta": meta,
        "runs": list(records),
        "groups": aggregate(pooled),
        "baselines": baselines(pooled),
        "paired": paired(pooled, pooled_users, reference),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_user_metrics(out, pooled, pooled_users)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))
    if plots and records:
        plot_recall_at_k(report, out / "recall_at_k.png")
        plot_training_curves(report, out / "training_curves.png")
    return report


# --------------------------------------------------------------------------- the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--datasets", nargs="+", help=f"names ({', '.join(DATASETS)}) or paths (default: the three names)"
    )
    add_data_root_argument(p)
    p.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=["loo"], help="default: loo")
    p.add_argument("--towers", nargs="+", choices=tower_names(), help="default: every tower")
    p.add_argument(
        "--fusions",
        nargs="+",
        choices=FUSIONS,
        default=["none"],
        help="fusion modes of the towers that read side information "
        f"({', '.join(t for t in tower_names() if takes_side_information(t))}); default none",
    )
    p.add_argument(
        "--fusion-towers",
        nargs="+",
        choices=tower_names(),
        help="the towers run in every --fusions mode "
        "(default: those of --towers that read side information); the others run none only",
    )
    p.add_argument("--side-features", default="attributes", help="side features of the fusion runs")
    p.add_argument(
        "--seeds", nargs="+", type=int, help=f"training seeds (default {' '.join(map(str, DEFAULT_SEEDS))})"
    )
    p.add_argument("--epochs", type=int, help="every run's train.epochs (default: the preset's)")
    p.add_argument(
        "--folds",
        type=int,
        default=1,
        help="comirec: N disjoint test folds per seed (data.folds; each user tested once, metrics "
        "pooled over all users); default 1, the single 8:1:1 split",
    )
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="for every run")
    p.add_argument(
        "--max-users",
        type=int,
        help=f"each dataset's first N users only (0 = all; --quick: {QUICK_MAX_USERS})",
    )
    p.add_argument(
        "--out", type=Path, help="results folder (default runs/quality, runs/quality-quick with --quick)"
    )
    p.add_argument(
        "--runs",
        type=Path,
        help="where the run folders are (default --out): reports of different commands in their own "
        "--out can share runs",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: ML-100K's first {QUICK_MAX_USERS} users, towers {' '.join(QUICK_TOWERS)}, "
        f"one seed, 1 epoch, {' '.join(QUICK_SETS)} (each flag given still applies)",
    )
    p.add_argument(
        "--reference",
        metavar="TOWER-FUSION",
        help="the row the others are compared with on the same users (e.g. sasrec-none; default: "
        "each table's first)",
    )
    p.add_argument("--no-plots", action="store_true", help="write results.json and results.md only")
    p.add_argument(
        "--dry-run", action="store_true", help="list the runs (new, interrupted, finished) and stop"
    )
    p.add_argument("--quiet", action="store_true", help="no Keras progress output")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.datasets = args.datasets or ["ml100k"]
        args.towers = args.towers or list(QUICK_TOWERS)
        args.seeds = args.seeds or [DEFAULT_SEEDS[0]]
        args.epochs = 1 if args.epochs is None else args.epochs
        args.max_users = QUICK_MAX_USERS if args.max_users is None else args.max_users
        args.set = [*QUICK_SETS, *args.set]
    args.datasets = list(dict.fromkeys(args.datasets or DATASETS))
    args.towers = list(dict.fromkeys(args.towers or tower_names()))
    args.seeds = list(dict.fromkeys(args.seeds or DEFAULT_SEEDS))
    args.max_users = args.max_users or 0
    if args.folds < 1:
        p.error(f"--folds must be at least 1, got {args.folds}")
    args.out = args.out or Path("runs/quality-quick" if args.quick else "runs/quality")
    args.runs = args.runs or args.out
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    meta: dict[str, Any] = {
        **run_meta("python -m bench.quality " + shlex.join(args.argv)),
        "seeds": args.seeds,
        "folds": args.folds,
        "epochs": args.epochs,
        "set": args.set,
        "runs": str(args.runs),
    }
    try:
        runs, configs = planned_runs(args)
        done = sum(finished(c, r.folder(args.runs)) for r, c in zip(runs, configs, strict=True))
        interrupted = sum(run_folder(r.folder(args.runs)).is_dir() for r in runs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(runs)} runs: {done} finished, {interrupted} interrupted, in {args.runs}", flush=True)
    if args.dry_run:
        list_runs(runs, configs, args.runs)
        return 0
    report = train_and_report(args, meta, runs, configs)
    print("\n" + markdown(report))
    print(f"written to {args.out}")
    return 0


def planned_runs(args: argparse.Namespace) -> tuple[list[Run], list[Config]]:
    """The command's runs and their configurations (every override checked before anything trains).

    Raises:
        ValueError: an unknown dataset, a fusion without side features, a bad override.
    """
    datasets = [resolve_dataset(d, args.max_users, args.runs, args.data_root) for d in args.datasets]
    runs = plan(
        datasets,
        args.protocols,
        args.towers,
        args.fusions,
        args.side_features,
        args.seeds,
        args.fusion_towers,
        args.folds,
    )
    return runs, [run_config(r, args.epochs, args.set) for r in runs]


def list_runs(runs: Sequence[Run], configs: Sequence[Config], root: Path) -> None:
    """``--dry-run``: each run's state (new, interrupted, finished), folder, preset and epochs."""
    for run, config in zip(runs, configs, strict=True):
        folder = run.folder(root)
        state = (
            "finished"
            if finished(config, folder)
            else "interrupted"
            if run_folder(folder).is_dir()
            else "new"
        )
        print(f"{state:<11} {folder}  (preset {run.preset}, {config.train.epochs} epochs)")


def train_and_report(
    args: argparse.Namespace, meta: dict[str, Any], runs: Sequence[Run], configs: Sequence[Config]
) -> dict[str, Any]:
    """Trains (or reads back) every run in order, rewriting the report after each; then the plots."""
    records, per_user = [], []
    loaded: dict[tuple[Any, ...], InMemoryData] = {}
    for i, (run, config) in enumerate(zip(runs, configs, strict=True)):
        folder = run.folder(args.runs)
        fold = f" (test fold {run.fold} of 0..{run.folds - 1})" if run.folds > 1 else ""
        print(f"\n=== [{i + 1}/{len(runs)}] {folder}{fold}", flush=True)
        config = refit_budget(run, config, args.runs, args.set)
        metrics, how = run_one(config, folder, verbose=0 if args.quiet else 2)
        records.append(
            {
                **{k: v for k, v in dataclasses.asdict(run).items() if k != "dataset"},
                "dataset": run.dataset.name,
                "data": run.dataset.path,
                "preset": run.preset,
                "folder": str(folder),
                "obtained": how,
                "metrics": metrics,
            }
        )
        per_user.append(user_test_metrics(config, folder, loaded))
        headline = MONITOR[run.protocol]
        print(
            f"{how}: test {headline} {metrics['test'].get(headline, float('nan')):.4f} over "
            f"{len(per_user[-1].users)} users, {metrics['train_seconds']:.0f} s",
            flush=True,
        )
        write_report(args.out, meta, records, plots=False, per_user=per_user, reference=args.reference)
    return write_report(args.out, meta, records, not args.no_plots, per_user, args.reference)


if __name__ == "__main__":
    sys.exit(main())
