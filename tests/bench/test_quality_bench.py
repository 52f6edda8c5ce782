"""``bench/quality.py``: the run plan and configurations, then a ``--quick`` report end to end
(aggregates against numpy over the runs' own ``metrics.json``, the table, read-back)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import paired as paired_bench
from bench import quality
from bench.markdown import mean_cell
from retrieval.data.loaders import load_interactions
from retrieval.evaluation import UserMetrics, compare_user_metrics
from retrieval.training import presets
from retrieval.training.config import Config
from retrieval.training.presets import Preset


def test_plan_runs_fusions_only_on_towers_with_side_information() -> None:
    data = quality.Dataset("log", "/x/log.csv")
    runs = quality.plan([data], ["loo"], ["youtubednn", "sasrec", "sa"], ["none", "nova"], "gap_prev", [1, 2])
    assert [(r.tower, r.fusion, r.side_features, r.seed) for r in runs] == [
        ("youtubednn", "none", "", 1),
        ("youtubednn", "none", "", 2),
        ("sasrec", "none", "", 1),
        ("sasrec", "none", "", 2),
        ("sasrec", "nova", "gap_prev", 1),
        ("sasrec", "nova", "gap_prev", 2),
        ("sa", "none", "", 1),
        ("sa", "none", "", 2),
        ("sa", "nova", "gap_prev", 1),
        ("sa", "nova", "gap_prev", 2),
    ]
    assert runs[4].folder(Path("out")) == Path("out/log/loo/sasrec-nova/seed1")
    # Only the fusion towers named run the fusion modes.
    runs = quality.plan([data], ["loo"], ["sasrec", "sa"], ["none", "nova"], "gap_prev", [1], ["sasrec"])
    assert [(r.tower, r.fusion) for r in runs] == [("sasrec", "none"), ("sasrec", "nova"), ("sa", "none")]
    # fmlprec has no attention for nova: it runs the other modes asked.
    runs = quality.plan([data], ["loo"], ["fmlprec"], ["none", "sum", "nova"], "attributes", [1])
    assert [r.fusion for r in runs] == ["none", "sum"]
    with pytest.raises(ValueError, match="nova need --side-features"):
        quality.plan([data], ["loo"], ["sasrec"], ["nova"], "", [1])
    with pytest.raises(ValueError, match="youtubednn take no side information"):
        quality.plan([data], ["loo"], ["youtubednn"], ["nova"], "gap_prev", [1], ["youtubednn"])


def test_run_config_layers_preset_run_epochs_then_set(monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = Preset(
        "beauty-sasrec",
        "beauty",
        ("model.tower=sasrec", "train.learning_rate=0.005", "train.epochs=7", "model.dim=32"),
    )
    monkeypatch.setitem(presets.PRESETS, "beauty-sasrec", tuned)
    named = quality.Dataset("beauty", "/data/Beauty.txt", preset="beauty")
    run = quality.Run(named, "comirec", "sasrec", "nova", "attributes", 7)
    assert run.preset == "beauty-sasrec"
    config = quality.run_config(run, None, [])
    assert (config.train.learning_rate, config.train.epochs, config.model.dim) == (0.005, 7, 32)  # the preset
    assert (config.data.path, config.data.protocol, config.train.seed) == ("/data/Beauty.txt", "comirec", 7)
    assert (config.model.fusion, config.model.side_features) == ("nova", "attributes")
    config = quality.run_config(run, 3, ["model.dim=8", "train.learning_rate=0.01"])
    assert (config.train.epochs, config.model.dim, config.train.learning_rate) == (3, 8, 0.01)
    # A dataset given as a path starts from the tower's own preset, as mitt train without --preset.
    own = Preset("sasrec", None, ("model.tower=sasrec", "train.learning_rate=0.002"))
    monkeypatch.setitem(presets.PRESETS, "sasrec", own)
    plain = quality.Run(quality.Dataset("log", "/x/log.csv"), "loo", "sasrec", "none", "", 1)
    assert plain.preset == "sasrec"
    assert quality.run_config(plain, None, []).train.learning_rate == 0.002


def test_a_refit_run_trains_its_loo_runs_best_step(tmp_path: Path) -> None:
    data = quality.Dataset("log", "/x/log.csv")
    refit = quality.Run(data, "loo-refit", "sasrec", "none", "", 3)
    config = quality.run_config(refit, None, [])
    with pytest.raises(ValueError, match="add loo before loo-refit"):
        quality.refit_budget(refit, config, tmp_path, [])
    twin = quality.Run(data, "loo", "sasrec", "none", "", 3).folder(tmp_path)
    twin.mkdir(parents=True)
    (twin / "metrics.json").write_text(json.dumps({"best_step": 1234}))
    assert quality.refit_budget(refit, config, tmp_path, []).train.max_steps == 1234
    # Another seed's loo run is not this run's twin.
    other = quality.Run(data, "loo-refit", "sasrec", "none", "", 4)
    with pytest.raises(ValueError, match="does not exist"):
        quality.refit_budget(other, quality.run_config(other, None, []), tmp_path, [])
    # A budget given on the command line wins; a loo run is left as it is.
    given = quality.run_config(refit, None, ["train.max_steps=50"])
    assert quality.refit_budget(refit, given, tmp_path, ["train.max_steps=50"]).train.max_steps == 50
    in_epochs = quality.run_config(refit, 2, [])
    assert quality.refit_budget(refit, in_epochs, tmp_path, []) == in_epochs
    loo = quality.Run(data, "loo", "sasrec", "none", "", 3)
    loo_config = quality.run_config(loo, None, [])
    assert quality.refit_budget(loo, loo_config, tmp_path, []) == loo_config
    (twin / "metrics.json").write_text(json.dumps({"best_step": None}))
    with pytest.raises(ValueError, match="no best step"):
        quality.refit_budget(refit, config, tmp_path, [])


def test_preset_dataset_names_resolve_to_shared_data(shared_data: Path, tmp_path: Path) -> None:
    dataset = quality.resolve_dataset("ml100k", 0, tmp_path)
    assert (dataset.name, dataset.path, dataset.preset) == ("ml100k", str(shared_data / "ml-100k"), "ml100k")
    with pytest.raises(ValueError, match="does not exist"):
        quality.resolve_dataset(str(tmp_path / "missing.csv"), 0, tmp_path)


def test_slices_keep_the_first_users_and_what_the_format_carries(tmp_path: Path) -> None:
    s3rec = tmp_path / "Toy.txt"
    s3rec.write_text("7 3 1 2\n5 2 4\n9 1 3 4 5\n")
    (tmp_path / "Toy_item2attributes.json").write_text(json.dumps({"1": [10], "2": [11, 12], "5": [13]}))
    sliced = quality.slice_dataset(str(s3rec), 2, tmp_path / "s3rec")
    assert Path(sliced).read_text() == "7 3 1 2\n5 2 4\n"
    kept = json.loads((tmp_path / "s3rec" / "data_item2attributes.json").read_text())
    assert kept == {"1": ["10"], "2": ["11", "12"]}  # item 5 is not in the slice, 3 and 4 have none
    assert load_interactions(sliced).items.set_index("item")["attributes"].to_dict()["2"] == ["11", "12"]

    table = tmp_path / "log.csv"
    table.write_text("user,item,timestamp,rating,title\nb,x,5,4,X\na,y,3,2,Y\nb,y,9,5,Y\nc,x,1,1,X\n")
    sliced = quality.slice_dataset(str(table), 2, tmp_path / "table")
    events = load_interactions(sliced).events
    assert events[["user", "item", "timestamp", "rating"]].values.tolist() == [
        ["b", "x", 5, 4],
        ["a", "y", 3, 2],
        ["b", "y", 9, 5],
    ]  # users b and a (the first two to appear), time and side columns kept
    assert load_interactions(sliced).items.set_index("item")["title"].to_dict() == {"x": "X", "y": "Y"}


def test_mean_std_is_the_sample_deviation() -> None:
    assert quality.mean_std([0.1, 0.2, 0.6]) == pytest.approx((0.3, np.std([0.1, 0.2, 0.6], ddof=1)))
    assert quality.mean_std([0.25]) == (0.25, None)  # one seed: no spread to report
    assert mean_cell(0.25, None) == "0.2500"
    assert mean_cell(0.123456, 0.01) == "0.1235 ± 0.0100"


def _table_rows(markdown: str, heading: str) -> dict[str, dict[str, str]]:
    """The rows of the first table under ``heading``, by their first two cells."""
    section = markdown.split(heading, 1)[1].split("###", 1)[0].splitlines()
    first = next(i for i, line in enumerate(section) if line.startswith("|"))
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), section[first:]))  # the first table
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[f"{cells[0]} {cells[1]}"] = dict(zip(header, cells, strict=True))
    return rows


@pytest.mark.slow  # trains the quick report's runs: 20 s here
def test_quick_report(
    synthetic_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "quality"
    argv = ["--quick", "--datasets", str(synthetic_csv), "--seeds", "1", "2", "--out", str(out), "--quiet"]
    assert quality.main(argv) == 0

    report = json.loads((out / "results.json").read_text())
    for name in ("recall_at_k.png", "training_curves.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --quick: two towers, the given seeds, 1 epoch, small models, the data's first 200 users
    # (all 60 of them) written as a slice.
    folders = {
        (t, s): out / "log-200users" / "loo" / f"{t}-none" / f"seed{s}"
        for t in quality.QUICK_TOWERS
        for s in (1, 2)
    }
    assert sorted((r["tower"], r["seed"]) for r in report["runs"]) == sorted(folders)
    assert {r["obtained"] for r in report["runs"]} == {"trained"}
    for (tower, seed), folder in folders.items():
        config = json.loads((folder / "config.json").read_text())
        assert (config["model"]["tower"], config["train"]["seed"], config["train"]["epochs"]) == (
            tower,
            seed,
            1,
        )
        assert config["model"]["dim"] == 16
        assert config["data"]["path"] == str(out.resolve() / "log-200users" / "data.csv")
    # Seeds change training: the two runs of a tower do not have the same loss.
    for tower in quality.QUICK_TOWERS:
        losses = [
            json.loads((folders[tower, s] / "metrics.json").read_text())["train_loss_per_epoch"]
            for s in (1, 2)
        ]
        assert losses[0] != losses[1]

    # Aggregates: mean and sample std over the seeds' own metrics.json files.
    groups = {g["tower"]: g for g in report["groups"]}
    assert sorted(groups) == sorted(quality.QUICK_TOWERS)
    for tower, group in groups.items():
        per_seed = [json.loads((folders[tower, s] / "metrics.json").read_text()) for s in (1, 2)]
        assert group["seeds"] == [1, 2]
        assert set(group["mean"]) == {*per_seed[0]["test"], "train_seconds"}
        for metric in ("hr@10", "ndcg@10", "hr@50", "recall@20", "ndcg@50"):
            values = np.array([m["test"][metric] for m in per_seed])
            assert group["mean"][metric] == pytest.approx(values.mean(), abs=1e-12)
            assert group["std"][metric] == pytest.approx(values.std(ddof=1), abs=1e-12)
        seconds = [m["train_seconds"] for m in per_seed]
        assert group["mean"]["train_seconds"] == pytest.approx(np.mean(seconds))
    baseline = report["baselines"][0]["test"]
    assert (
        baseline
        == json.loads((folders["sasrec", 1] / "metrics.json").read_text())["baseline_popularity_test"]
    )

    # The table: the baseline and one row per configured tower/fusion, cells from the aggregates.
    markdown = (out / "results.md").read_text()
    assert "python -m bench.quality --quick --datasets" in markdown and "load average" in markdown
    rows = _table_rows(markdown, "### log-200users: leave-one-out")
    assert sorted(rows) == sorted(["most popular –", "`youtubednn` none", "`sasrec` none"])
    assert list(rows["most popular –"])[3:9] == ["HR@10", "NDCG@10", "HR@20", "NDCG@20", "HR@50", "NDCG@50"]
    assert rows["most popular –"]["NDCG@10"] == f"{baseline['ndcg@10']:.4f}"
    for tower in groups:
        row = rows[f"`{tower}` none"]
        assert row["seeds"] == "2"
        ndcg = [
            json.loads((folders[tower, s] / "metrics.json").read_text())["test"]["ndcg@10"] for s in (1, 2)
        ]
        assert row["NDCG@10"] == f"{np.mean(ndcg):.4f} ± {np.std(ndcg, ddof=1):.4f}"

    # Paired against the first row (youtubednn): per-user values recomputed from each saved model,
    # which average to the run's own test metrics, then seed-averaged and differenced per user.
    per_user = {
        key: quality.user_test_metrics(
            Config.from_dict(json.loads((folder / "config.json").read_text())), folder, {}
        ).values
        for key, folder in folders.items()
    }
    for key, values in per_user.items():
        test = json.loads((folders[key] / "metrics.json").read_text())["test"]
        for metric, v in values.items():
            assert v.mean() == pytest.approx(test[metric], abs=1e-9), (key, metric)
        assert (folders[key] / "user_metrics.csv").is_file()  # kept beside the run
    (entry,) = report["paired"]
    assert (entry["reference"], entry["users"]) == ("youtubednn-none", 60)
    (row,) = entry["rows"]
    assert (row["tower"], row["seeds"]) == ("sasrec", [1, 2])
    for metric in ("ndcg@10", "hr@50"):
        d = np.mean([per_user["sasrec", s][metric] for s in (1, 2)], axis=0) - np.mean(
            [per_user["youtubednn", s][metric] for s in (1, 2)], axis=0
        )
        assert row["difference"][metric] == pytest.approx(d.mean(), abs=1e-12)
        assert row["se"][metric] == pytest.approx(d.std(ddof=1) / np.sqrt(60), abs=1e-12)
    paired_rows = _table_rows(markdown, "Paired against `youtubednn-none` on the same 60 test users")
    cell = paired_rows["`sasrec` none"]["NDCG@10"].replace("*", "")
    relative = f"{row['relative']['ndcg@10']:+.1%}"
    assert cell == f"{row['difference']['ndcg@10']:+.4f} ± {row['se']['ndcg@10']:.4f} ({relative})"
    # --reference picks another row. (The reports after the first need no plots: those are checked.)
    reread = [*argv, "--no-plots"]
    again_argv = [*reread, "--reference", "sasrec-none", "--out", str(tmp_path / "ref"), "--runs", str(out)]
    assert quality.main(again_argv) == 0
    (entry,) = json.loads((tmp_path / "ref" / "results.json").read_text())["paired"]
    assert entry["reference"] == "sasrec-none"
    assert entry["rows"][0]["difference"]["ndcg@10"] == pytest.approx(-row["difference"]["ndcg@10"])

    # A second invocation reads every finished run back: nothing trains.
    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(quality, "train", no_training)
    assert quality.main(reread) == 0
    again = json.loads((out / "results.json").read_text())
    assert {r["obtained"] for r in again["runs"]} == {"read"}
    assert again["groups"] == report["groups"]
    # ... also into a report of its own that reads the runs from elsewhere (--runs).
    assert quality.main([*reread, "--out", str(tmp_path / "other"), "--runs", str(out)]) == 0
    other = json.loads((tmp_path / "other" / "results.json").read_text())
    assert other["groups"] == report["groups"] and {r["obtained"] for r in other["runs"]} == {"read"}
    assert not (tmp_path / "other" / "log-200users").exists()
    capsys.readouterr()
    assert quality.main([*argv, "--dry-run"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "seed" in line]
    assert listed == ["finished"] * 4
    # Another configuration over a finished run is refused before anything runs.
    assert quality.main([*argv, "--epochs", "2"]) == 2


def test_folds_plan_comirec_runs_per_fold_with_their_own_folders_and_config() -> None:
    data = quality.Dataset("log", "/x/log.csv")
    runs = quality.plan([data], ["loo", "comirec"], ["sa"], ["none"], "", [1, 2], folds=3)
    assert [(r.protocol, r.seed, r.folds, r.fold) for r in runs] == [
        ("loo", 1, 1, 0),
        ("loo", 2, 1, 0),  # leave-one-out tests every user already
        *[("comirec", s, 3, f) for s in (1, 2) for f in range(3)],
    ]
    assert runs[0].folder(Path("out")) == Path("out/log/loo/sa-none/seed1")
    assert runs[3].folder(Path("out")) == Path("out/log/comirec/sa-none/seed1-fold1of3")
    config = quality.run_config(runs[3], None, [])
    assert (config.data.protocol, config.data.folds, config.data.fold) == ("comirec", 3, 1)
    assert quality.run_config(runs[0], None, []).data.folds == 1


def _fold_records(
    rng: np.random.Generator, towers: tuple[str, ...], folds: int, users: int
) -> tuple[list[dict[str, Any]], list[UserMetrics]]:
    """Records and per-user metrics as train_and_report keeps them, for runs that never trained."""
    ids = [f"u{u}" for u in rng.permutation(users)]
    bounds = [f * users // folds for f in range(folds + 1)]
    records, per_user = [], []
    for tower in towers:
        for fold in range(folds):
            fold_ids = tuple(ids[bounds[fold] : bounds[fold + 1]])
            values = {m: rng.random(len(fold_ids)) for m in ("recall@50", "ndcg@50")}
            means = {m: float(v.mean()) for m, v in values.items()}
            metrics = {
                "test": {**means, "diversity@50": 0.5 + fold},
                "baseline_popularity_test": {"recall@50": 0.1 * (fold + 1)},
                "train_seconds": 10.0 + fold,
            }
            run = {"dataset": "log", "protocol": "comirec", "tower": tower, "fusion": "none"}
            records.append(
                {**run, "side_features": "", "seed": 1, "folds": folds, "fold": fold, "metrics": metrics}
            )
            per_user.append(UserMetrics(fold_ids, values))
    return records, per_user


def test_pooled_folds_are_means_over_every_user(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    records, per_user = _fold_records(rng, ("sa", "sasrec"), 3, 31)  # folds of 10, 10, 11 users
    pooled, users = quality.pool_folds(records, per_user)
    assert [(r["tower"], r["folds_pooled"]) for r in pooled] == [("sa", [0, 1, 2]), ("sasrec", [0, 1, 2])]
    for record, u, start in zip(pooled, users, (0, 3), strict=True):
        assert len(u.users) == 31 and u.users == tuple(
            x for p in per_user[start : start + 3] for x in p.users
        )
        for m in ("recall@50", "ndcg@50"):  # the mean of the pooled users' values
            all_values = np.concatenate([p.values[m] for p in per_user[start : start + 3]])
            assert record["metrics"]["test"][m] == pytest.approx(all_values.mean(), abs=1e-12)
        # Fold means weighted by their users: (10 * 0.5 + 10 * 1.5 + 11 * 2.5) / 31.
        assert record["metrics"]["test"]["diversity@50"] == pytest.approx((5 + 15 + 27.5) / 31)
        assert record["metrics"]["baseline_popularity_test"]["recall@50"] == pytest.approx((1 + 2 + 3.3) / 31)
        assert record["metrics"]["train_seconds"] == 33.0

    # The report: tables of the pooled values, sa paired against sasrec by user id, per-user files.
    meta = {"date": "d", "commit": "c", "command": "python -m bench.quality", "machine": "m", "load_start": 0}
    meta["runs"] = str(tmp_path)
    report = quality.write_report(tmp_path, {**meta, "folds": 3}, records, False, per_user, "sasrec-none")
    assert [g["tower"] for g in report["groups"]] == ["sa", "sasrec"]
    assert report["groups"][0]["mean"]["recall@50"] == pooled[0]["metrics"]["test"]["recall@50"]
    (entry,) = report["paired"]
    assert (entry["reference"], entry["users"]) == ("sasrec-none", 31)
    sa = users[0]
    sasrec = UserMetrics.load(tmp_path / "users" / "log" / "comirec" / "sasrec-none.csv").aligned_with(sa)
    d = sa.values["recall@50"] - sasrec.values["recall@50"]
    (row,) = entry["rows"]
    assert row["difference"]["recall@50"] == pytest.approx(d.mean(), abs=1e-12)
    assert row["se"]["recall@50"] == pytest.approx(d.std(ddof=1) / np.sqrt(31), abs=1e-12)
    ratio = sa.values["recall@50"].mean() / sasrec.values["recall@50"].mean()
    assert row["relative"]["recall@50"] == pytest.approx(ratio - 1)
    assert "3 test folds pooled: every user tested once" in (tmp_path / "results.md").read_text()
    # A seed whose folds are not all done yet is left out of the tables and comparisons.
    partial = quality.write_report(tmp_path, {**meta, "folds": 3}, records[:5], False, per_user[:5])
    assert [g["tower"] for g in partial["groups"]] == ["sa"] and partial["paired"] == []
    assert len(partial["runs"]) == 5


def test_paired_command_compares_two_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    ids = tuple(f"u{u}" for u in range(40))
    a = UserMetrics(ids, {"recall@50": rng.random(40), "ndcg@50": rng.random(40)})
    b = UserMetrics(ids[::-1], {"recall@50": rng.random(40), "ndcg@50": rng.random(40)})
    a.save(tmp_path / "a.csv")
    b.save(tmp_path / "b.csv")
    argv = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--metrics", "recall@50", "--names", "K4", "K1"]
    assert paired_bench.main([*argv, "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    c = compare_user_metrics(a, b)["recall@50"]
    low, high = c.relative_interval
    row = next(line for line in out.splitlines() if line.startswith("| recall@50"))
    assert row.replace("*", "") == (
        f"| recall@50 | {c.mean_a:.4f} | {c.mean_b:.4f} | {c.difference:+.4f} ± {c.se:.4f} | "
        f"[{c.low:+.4f}, {c.high:+.4f}] | {c.relative:+.1%} [{low:+.1%}, {high:+.1%}] |"
    )
    assert "| metric | K4 | K1 |" in out and "40 users" in out
    saved = json.loads((tmp_path / "c.json").read_text())["metrics"]["recall@50"]
    assert saved["difference"] == pytest.approx(c.difference) and saved["relative_interval"] == [low, high]
    UserMetrics(ids[:30], {"recall@50": np.zeros(30)}).save(tmp_path / "fewer.csv")
    assert paired_bench.main([str(tmp_path / "a.csv"), str(tmp_path / "fewer.csv")]) == 2
    assert "different users" in capsys.readouterr().err


def test_a_run_saved_before_a_config_field_existed_is_still_finished(tmp_path: Path) -> None:
    config = Config()
    saved = config.to_dict()
    del saved["data"]["folds"], saved["data"]["fold"]  # written before the fields existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    (tmp_path / "metrics.json").write_text("{}")
    assert quality.finished(config, tmp_path)
    with pytest.raises(ValueError, match=r"data\.fold: 0 -> 1"):
        quality.finished(quality.apply_overrides(config, ["data.folds=2", "data.fold=1"]), tmp_path)


@pytest.mark.slow  # trains two folds of one tower (YouTube DNN, the quickest to build): ~5 s here
def test_quick_report_in_folds(synthetic_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "folds"
    argv = ["--quick", "--datasets", str(synthetic_csv), "--towers", "youtubednn", "--protocols", "comirec"]
    assert quality.main([*argv, "--folds", "2", "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = json.loads((out / "results.json").read_text())
    assert [(r["fold"], r["folds"]) for r in report["runs"]] == [(0, 2), (1, 2)]
    folds = [UserMetrics.load(r["folder"]) for r in report["runs"]]
    assert not set(folds[0].users) & set(folds[1].users)
    pooled = UserMetrics.load(out / "users" / "log-200users" / "comirec" / "youtubednn-none.csv")
    assert set(pooled.users) == set(folds[0].users) | set(folds[1].users)
    assert len(pooled.users) == 60  # every synthetic user has enough events: each is tested once
    (group,) = report["groups"]
    for metric in ("recall@50", "ndcg@50", "hitrate@20"):
        assert group["mean"][metric] == pytest.approx(pooled.values[metric].mean(), abs=1e-9)
