"""``bench.peers``: its pure parts (the shared split, RecBole's atomic file and the check of
RecBole's split, the evaluation of exported vectors, the comparison), then one ``--smoke`` run
end to end, which installs the peers' venvs into the cache the first time."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench import peers
from bench.peers import runs as peer_runs
from retrieval.artifacts.model import ModelArtifact, pad_left
from retrieval.data.datasets import DATA_ROOT_ENV, DATASETS
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.splits import comirec_split, leave_one_out
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation.evaluate import evaluate_comirec, evaluate_ranking


@pytest.fixture()
def log_csv(tmp_path: Path) -> Path:
    """30 users over 25 items with string ids ("i<n>"), 2 to 12 events each (seeded)."""
    rng = np.random.default_rng(0)
    rows = ["user,item,timestamp"]
    for u in range(30):
        n = 2 if u == 3 else int(rng.integers(3, 13))  # user 3 is too short to evaluate
        for t, item in enumerate(rng.choice(25, size=n, replace=False)):
            rows.append(f"u{u},i{item},{1000 * u + t}")
    path = tmp_path / "log.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture()
def data(log_csv: Path):
    return build_sequences(load_interactions(log_csv))


def test_loo_split_is_the_library_split(data) -> None:
    split = peers.make_split(data, "loo")
    loo = leave_one_out(data)
    assert len(split.train) == len(data.users)
    for a, b in zip(split.train, loo.train, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(split.test_users, loo.test_users)
    assert [int(t[0]) for t in split.test_targets] == loo.test_targets.tolist()
    assert [int(t[0]) for t in split.valid_targets] == loo.valid_targets.tolist()
    assert 3 not in split.test_users.tolist()  # two events: training only


def test_comirec_split_is_the_library_split(data) -> None:
    split = peers.make_split(data, "comirec", seed=7)
    parts = comirec_split(data.sequences, 7)
    np.testing.assert_array_equal(split.train_users, parts.train_users)
    assert [t.tolist() for t in split.test_targets] == [t.tolist() for t in parts.test_targets]
    assert [h.tolist() for h in split.valid_histories] == [h.tolist() for h in parts.valid_histories]
    with pytest.raises(ValueError, match="unknown protocol"):
        peers.make_split(data, "sampled")


def test_payload_speaks_external_ids(data) -> None:
    split = peers.make_split(data, "loo")
    payload = json.loads(json.dumps(peers.split_payload(split)))
    assert payload["items"] == list(data.vocab.ids)
    first = int(split.test_users[0])
    assert payload["test"]["users"][0] == data.users[first]
    assert payload["test"]["histories"][0] == data.vocab.external(data.sequences[first][:-1])
    assert payload["test"]["targets"][0] == data.vocab.external(data.sequences[first][-1:])
    assert all(i.startswith("i") for seq in payload["train"] for i in seq)


def _parse_atomic(text: str) -> dict[str, list[tuple[float, str]]]:
    lines = text.strip().split("\n")
    assert lines[0] == "user_id:token\titem_id:token\ttimestamp:float"
    events: dict[str, list[tuple[float, str]]] = {}
    for line in lines[1:]:
        user, item, time = line.split("\t")
        events.setdefault(user, []).append((float(time), item))
    return events


def test_atomic_file_makes_our_split_under_recbole_leave_one_out(data) -> None:
    split = peers.make_split(data, "loo")
    events = _parse_atomic(peers.recbole_atomic_inter(split))
    # RecBole's LS valid_and_test, order TO: per user by time, last = test, second-to-last = valid.
    reported: dict = {
        "valid": {},
        "test": {},
        "valid_histories": {},
        "test_histories": {},
        "train_instances": 0,
    }
    for user, rows in events.items():
        items = [item for _, item in sorted(rows)]
        assert [t for t, _ in rows] == sorted(t for t, _ in rows)
        if data.users.index(user) in split.test_users.tolist():
            reported["test"][user], reported["valid"][user] = items[-1], items[-2]
            reported["test_histories"][user], reported["valid_histories"][user] = items[:-1], items[:-2]
            reported["train_instances"] += max(len(items) - 3, 0)
        else:
            reported["train_instances"] += len(items) - 1
    assert events["u3"] == [(0.0, data.vocab.ids[data.sequences[3][0] - 1]), (1.0, events["u3"][1][1])]
    assert peers.check_recbole_split(split, reported, max_len=50) == {"equal": True, "problems": []}

    user = next(iter(reported["test"]))
    reported["test"][user] = "i999"
    reported["train_instances"] += 1
    check = peers.check_recbole_split(split, reported, max_len=50)
    assert not check["equal"]
    assert any(p.startswith("test targets: 1 users differ") for p in check["problems"])
    assert any(p.startswith("training pairs") for p in check["problems"])
    with pytest.raises(ValueError, match="leave-one-out"):
        peers.recbole_atomic_inter(peers.make_split(data, "comirec"))


def test_history_check_uses_the_truncated_history(data) -> None:
    split = peers.make_split(data, "loo")
    users, histories, targets = split.part("test")
    reported = {
        "test": {data.users[u]: data.vocab.ids[int(t[0]) - 1] for u, t in zip(users, targets, strict=True)},
        "test_histories": {
            data.users[u]: data.vocab.external(h[-2:]) for u, h in zip(users, histories, strict=True)
        },
    }
    check = peers.check_recbole_split(split, reported, max_len=2)
    assert not any(p.startswith("test") for p in check["problems"])


def test_align_items_maps_peer_rows_to_our_dense_ids() -> None:
    items = ("a", "b", "c", "d")
    vectors = np.array([[3.0, 0.0], [1.0, 0.0], [4.0, 0.0]], np.float32)  # rows for d, a, c; b missing
    table, missing = peers.align_items(["d", "a", "c"], vectors, items)
    np.testing.assert_array_equal(table[:, 0], [0.0, 1.0, 0.0, 4.0, 3.0])
    np.testing.assert_array_equal(missing, [2])
    with pytest.raises(ValueError, match="not in the data"):
        peers.align_items(["a", "z"], vectors[:2], items)
    with pytest.raises(ValueError, match="3 item vectors for 2 ids"):
        peers.align_items(["a", "b"], vectors, items)


def _mean_pool_model(vocab: ItemVocab, table: np.ndarray, max_len: int) -> ModelArtifact:
    """A stand-in user tower: K = 2 interests, the history's mean and its last item."""

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        items = inputs["items"]
        mean = table[items].sum(axis=1) / np.maximum((items > 0).sum(axis=1, keepdims=True), 1)
        return np.stack([mean, table[items[:, -1]]], axis=1).astype(np.float32)

    manifest = {"version": "test", "max_len": max_len, "num_interests": 2}
    return ModelArtifact(None, manifest, vocab, table, user_vectors)


@pytest.mark.parametrize("protocol", ["loo", "comirec"])
def test_exported_vectors_score_as_our_evaluator(data, protocol: str) -> None:
    rng = np.random.default_rng(1)
    table = rng.normal(size=(len(data.vocab) + 1, 16)).astype(np.float32)
    table[0] = 0.0
    model = _mean_pool_model(data.vocab, table, max_len=5)
    split = peers.make_split(data, protocol, seed=3)
    _, histories, targets = split.part("test")
    # The peer's export: our ids in its own order, user vectors computed on its side.
    order = rng.permutation(len(data.vocab))
    item_ids = [data.vocab.ids[i] for i in order]
    peer_table, missing = peers.align_items(item_ids, table[1:][order], split.items)
    users = model.user_vectors({"items": pad_left(histories, 5)})
    got = peers.evaluate_vectors(users, peer_table, histories, targets, protocol, missing)
    if protocol == "loo":
        expected = evaluate_ranking(model, histories, np.array([t[0] for t in targets]), ks=peers.LOO_KS)
    else:
        expected = evaluate_comirec(model, histories, targets, ks=peers.COMIREC_KS)
    assert got == pytest.approx(expected, abs=1e-12)
    assert set(got) == set(expected)


def test_items_without_vector_are_never_ranked() -> None:
    items = ("a", "b", "c")
    # The user points at "c", which the peer has no vector for: it must not be retrieved.
    table, missing = peers.align_items(["a", "b"], np.array([[1.0], [2.0]], np.float32), items)
    table[3] = 100.0  # even a huge stray row would not matter
    users = np.ones((1, 1, 1), np.float32)
    got = peers.evaluate_vectors(users, table, [np.zeros(0, np.int64)], [np.array([3])], "loo", missing)
    assert got["hr@50"] == 0.0
    got = peers.evaluate_vectors(users, table, [np.zeros(0, np.int64)], [np.array([2])], "loo", missing)
    assert got["hr@10"] == 1.0 and got["ndcg@10"] == 1.0  # "b" first, "a" second


def _result(
    side: str, model: str, protocol: str, curve: list[float], seconds: list[float], test: dict
) -> dict:
    return {
        "run": f"{side}-{model}",
        "side": side,
        "model": model,
        "protocol": protocol,
        "test": test,
        "validation_curve": curve,
        "speed": {**peers.speed([{"train_seconds": s} for s in seconds], 100, 200)},
        "process": {"peak_rss_mb": 500.0 if side == "ours" else 1000.0},
    }


def test_time_to_reach_and_ratios() -> None:
    peer = _result(
        "recbole", "SASRec", "loo", [0.01, 0.03, 0.02], [100, 100, 100], {"ndcg@10": 0.03, "hr@10": 0.05}
    )
    ours = _result(
        "ours", "sasrec", "loo", [0.02, 0.031, 0.04], [10, 12, 10], {"ndcg@10": 0.045, "hr@10": 0.06}
    )
    reach = peers.time_to_reach(ours, peer)
    # Peer's best 0.03 at epoch 2 after 200 s; ours passes it at epoch 2 after 10 + 12 s.
    assert reach == {
        "target": 0.03,
        "peer_epoch": 2,
        "peer_seconds": 200.0,
        "ours_epoch": 2,
        "ours_seconds": 22.0,
        "ratio": 0.11,
    }
    slow = _result("ours", "sasrec", "loo", [0.01, 0.02], [10, 10], {"ndcg@10": 0.02, "hr@10": 0.03})
    assert peers.time_to_reach(slow, peer)["ratio"] is None

    pairs, best = peers.compare([ours, peer])
    assert len(pairs) == 1 and len(best) == 1
    pair = pairs[0]
    assert pair["quality_ratio"] == {"ndcg@10": 1.5, "hr@10": 1.2}
    assert pair["epoch_seconds_ratio"] == 0.1  # medians 10 s vs 100 s
    assert pair["events_per_second_ratio"] == 10.0
    assert pair["peak_rss_ratio"] == 0.5
    meta = {
        "date": "d", "commit": "c", "machine": "m", "load_start": "0", "load_end": "0", "command": "x",
        "data": "p", "max_users": 0, "epochs": 3, "batch_size": 256, "dim": 64, "max_len": 50,
    }  # fmt: skip
    text = peers.markdown(meta, [ours, peer], pairs, best)
    assert "| ours | sasrec | 0.0600 | 0.0450 | – |" in text  # no hr@20 in this result
    assert "| loo | ours-sasrec | recbole-SASRec | ndcg@10 0.0450 vs 0.0300, hr@10 0.0600 vs 0.0500 |" in text
    assert "22 s vs 200 s = 0.11×" in text and "| 0.10× | 10.00× |" in text


def test_speed_uses_the_median_epoch() -> None:
    got = peers.speed([{"train_seconds": s} for s in (30.0, 10.0, 12.0)], examples=1200, events=2400)
    assert got["median_epoch_seconds"] == 12.0
    assert got["cumulative_seconds"] == [30.0, 40.0, 52.0]
    assert got["examples_per_second"] == 100.0 and got["events_per_second"] == 200.0


def test_model_runs_pick_sides_protocols_and_models() -> None:
    runs = peers.model_runs(["recbole", "deepmatch"], ["loo", "comirec"], None, "sa")
    names = [(r.protocol, r.name) for r in runs]
    assert names[:5] == [
        ("loo", "ours-sasrec"), ("loo", "ours-bert4rec"), ("loo", "ours-sa"),
        ("loo", "recbole-SASRec"), ("loo", "recbole-BERT4Rec"),
    ]  # fmt: skip
    assert ("comirec", "deepmatch-ComiRec-DR") in names and ("comirec", "ours-youtubednn") in names
    only = peers.model_runs(["deepmatch"], ["loo", "comirec"], ["sa", "ComiRec-SA"], "sa")
    assert [(r.protocol, r.name) for r in only] == [
        ("loo", "ours-sa"), ("comirec", "ours-sa"), ("comirec", "deepmatch-ComiRec-SA"),
    ]  # fmt: skip


def test_install_is_skipped_when_the_marker_matches(tmp_path: Path) -> None:
    peer = peers.PEER_ENVS["deepmatch"]
    marker = tmp_path / "deepmatch" / ".mitt-peer.json"
    marker.parent.mkdir()
    marker.write_text(json.dumps({"requirements": list(peer.requirements), "no_deps": list(peer.no_deps),
                                  "install_seconds": 12.5}))  # fmt: skip
    got = peers.ensure_env(peer, tmp_path)
    assert got["installed_now"] is False and got["install_seconds"] == 12.5
    commands = peers.install_commands(
        peers.PEER_ENVS["recbole"], tmp_path / "v", Path("/w/torch-2.13.0+cpu.whl")
    )
    assert commands[0][1:] == ["-m", "venv", str(tmp_path / "v")]
    assert "/w/torch-2.13.0+cpu.whl" in commands[1] and "recbole==1.2.1" in commands[1]
    assert not any(c.startswith("torch==") for c in commands[1])
    deepmatch = peers.install_commands(peer, tmp_path / "d")
    assert deepmatch[-1][-2:] == ["--no-deps", "tf-keras==2.21.0"]


def test_runners_are_standalone() -> None:
    """The runners run in the peers' venvs: they must not import the project."""
    for runner in sorted(peers.RUNNERS.glob("*.py")):
        tree = ast.parse(runner.read_text())
        imported = {
            (node.module or "").split(".")[0]
            if isinstance(node, ast.ImportFrom)
            else alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert not imported & {"retrieval", "towers", "index", "bench", "proto", "keras"}, runner.name
    assert {p.name for p in peers.RUNNERS.glob("*_runner.py")} == {e.runner for e in peers.PEER_ENVS.values()}


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_ours_worker_trains_on_the_benchmark_split_and_times_each_epoch(
    log_csv: Path, data, tmp_path: Path
) -> None:
    """Our side trains through the library's own ComiRec protocol: its validation numbers must be
    those of the benchmark's split, recomputed from the exported vectors."""
    settings = peers.Settings(str(log_csv), 0, 2, 32, 8, 10, 7, 2, 10, 1.0)
    run = peers.ModelRun("ours", "sa", "comirec")
    spec = {
        "config": peers.ours_config(run, str(log_csv), settings),
        "out": str(tmp_path / "run"),
        "protocol": "comirec",
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert peers.ours_worker(tmp_path / "spec.json") == 0

    export = tmp_path / "run" / "export"
    progress = json.loads((export / "progress.json").read_text())
    assert [e["epoch"] for e in progress["epochs"]] == [1, 2]
    assert all(e["train_seconds"] > 0 for e in progress["epochs"])
    split = peers.make_split(data, "comirec", seed=7)
    summary = peers.summarize(run, split, export, max_len=10)
    assert summary["selected_by"] == "recall@50"
    best = progress["epochs"][summary["best_epoch"] - 1]["validation"]
    table, missing = peers.align_items(
        json.loads((export / "item_ids.json").read_text()),
        np.load(export / "final" / "items.npy"),
        split.items,
    )
    recomputed = peers.validation_metrics(
        np.load(export / "final" / "valid_users.npy"), table, split, missing
    )
    assert recomputed["recall@50"] == pytest.approx(best["recall@50"], abs=1e-6)
    assert summary["validation_curve"] == [round(e["validation"]["recall@50"], 6) for e in progress["epochs"]]


def fake_data_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``root`` holding an empty file for every named dataset, made the data root (``$MITT_DATA``)."""
    for rel in DATASETS.values():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    monkeypatch.setenv(DATA_ROOT_ENV, str(root))
    return root


def test_ours_start_from_the_preset_of_a_preset_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Beauty our sasrec trains with its tuned preset (negatives, dropout) but the shared sizes
    and budget, validated every epoch; elsewhere from the tower's own preset; with presets off from
    the defaults."""
    from retrieval.training.config import Config
    from retrieval.training.presets import PRESETS, apply_preset

    beauty = str(fake_data_root(tmp_path / "root", monkeypatch) / DATASETS["beauty"])
    run = peers.ModelRun("ours", "sasrec", "loo")
    settings = peers.Settings(beauty, 0, 3, 128, 16, 20, 5, 2, 10, 0.0, ("train.temperature=0.5",))
    assert peers.ours_preset("sasrec", settings) == "beauty-sasrec"
    assert PRESETS["beauty-sasrec"].tuned
    config = Config.from_dict(peers.ours_config(run, "/tmp/split.txt", settings))
    assert (config.train.num_negatives, config.train.sampler, config.model.dropout) == (4096, "uniform", 0.5)
    assert (config.train.epochs, config.train.batch_size, config.train.eval_every) == (3, 128, 1)
    assert (config.model.dim, config.model.max_len, config.train.patience) == (16, 20, 3)
    assert (config.data.path, config.data.protocol) == ("/tmp/split.txt", "loo")
    assert config.train.temperature == 0.5

    # Presets off: the defaults; data of no preset: the tower's own preset, as mitt train's.
    for s, preset, base in (
        (dataclasses.replace(settings, presets=False), None, Config()),
        (dataclasses.replace(settings, data=str(tmp_path)), "sasrec", apply_preset(Config(), "sasrec")),
    ):
        assert peers.ours_preset("sasrec", s) == preset
        plain = Config.from_dict(peers.ours_config(run, "/tmp/split.txt", s))
        assert (plain.train.num_negatives, plain.model.dropout) == (
            base.train.num_negatives,
            base.model.dropout,
        )


def test_a_pair_trains_for_our_towers_epoch_budget_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --epochs both sides of a pair get our tower's preset budget (beauty-sasrec: 39,
    RecBole's SASRec too); towers without one the default; --epochs wins everywhere."""
    from bench.peers.ours import PAIR_EPOCHS, TUNED_EPOCHS
    from retrieval.training.config import Config

    beauty = str(fake_data_root(tmp_path / "root", monkeypatch) / DATASETS["beauty"])
    tuned = TUNED_EPOCHS["beauty-sasrec"]
    settings = peers.Settings(beauty, 0, None, 128, 16, 20, 5, 2, 10, 0.0)
    budget = {
        run.name: peers.run_settings(run, settings).epochs
        for run in peers.model_runs(["recbole", "deepmatch"], ["loo", "comirec"], None, "sa")
    }
    assert budget["ours-sasrec"] == budget["recbole-SASRec"] == tuned != PAIR_EPOCHS
    assert budget["ours-bert4rec"] == budget["recbole-BERT4Rec"] == PAIR_EPOCHS
    assert budget["deepmatch-ComiRec-SA"] == budget["ours-sa"] == PAIR_EPOCHS
    run = peers.ModelRun("ours", "sasrec", "loo")
    config = Config.from_dict(peers.ours_config(run, "/tmp/s.txt", settings))
    assert (config.train.epochs, config.train.patience) == (tuned, tuned)
    given = dataclasses.replace(settings, epochs=3)
    assert peers.run_settings(peers.ModelRun("recbole", "SASRec", "loo"), given).epochs == 3


def test_a_finished_run_is_read_back_only_with_the_same_settings_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ours is redone when its training configuration changed (an edited preset) even though the
    benchmark's settings did not; a peer run, with no config of ours, is read back."""

    class Trained(Exception):
        pass

    def run_process(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(peer_runs, "run_process", run_process)
    monkeypatch.setattr(peer_runs, "peer_command", lambda *args: ["peer"])
    settings = peers.Settings(str(tmp_path), 0, 3, 128, 16, 20, 5, 2, 10, 0.0)
    ours, peer = peers.ModelRun("ours", "sa", "comirec"), peers.ModelRun("deepmatch", "ComiRec-SA", "comirec")
    for run in (ours, peer):
        run_dir = tmp_path / run.name
        run_dir.mkdir()
        config = peers.ours_config(run, "/tmp/s.txt", settings) if run.side == "ours" else None
        finished = {"settings": dataclasses.asdict(settings), "config": config, "test": {"recall@50": 0.5}}
        (run_dir / "result.json").write_text(json.dumps(finished))
        args = (run, None, tmp_path, run_dir, "/tmp/s.txt", settings, {"python": "python"})
        assert peers.execute(*args)["test"] == {"recall@50": 0.5}
        if run.side == "ours":
            finished["config"]["train"]["learning_rate"] = 0.5
            (run_dir / "result.json").write_text(json.dumps(finished))
            with pytest.raises(Trained):
                peers.execute(*args)


@pytest.mark.network  # installs the peers' venvs from PyPI (once, into the cache)
@pytest.mark.slow  # trains four models in four processes: 45-70 s here
@pytest.mark.timeout(900)  # installs both peers' venvs on a new machine (~100 s here)
def test_smoke_run_trains_both_peers_and_ours_and_compares_them(shared_data: Path, tmp_path: Path) -> None:
    """``bench.peers --smoke`` end to end on ML-100K's first 40 users, one epoch, one pair per
    protocol: installs the peers' venvs (once, in the cache), runs RecBole's SASRec and
    DeepMatch's YouTubeDNN with their own code in their own processes, our two towers, and
    scores all four with our evaluator on one split."""
    out = tmp_path / "smoke"
    models = ["sasrec", "SASRec", "youtubednn", "YouTubeDNN"]
    assert peers.main(["--smoke", "--max-users", "40", "--models", *models, "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    runs = {(r["protocol"], r["side"], r["model"]): r for r in report["runs"]}
    assert set(runs) == {
        ("loo", "ours", "sasrec"),
        ("loo", "recbole", "SASRec"),
        ("comirec", "ours", "youtubednn"),
        ("comirec", "deepmatch", "YouTubeDNN"),
    }
    for (protocol, side, _), run in runs.items():
        headline = peers.HEADLINE[protocol]
        assert all(0.0 <= run["test"][k] <= 1.0 for k in headline), run["test"]
        assert (run["epochs_trained"], run["best_epoch"]) == (1, 1)
        assert run["speed"]["median_epoch_seconds"] > 0 and run["process"]["peak_rss_mb"] > 0
        assert run["items_without_vector"] == 0, f"{side} exported no vector for some items"
    assert runs["loo", "ours", "sasrec"]["check_exported_equals_training"]["equal"]
    assert [(p["ours"], p["peer"]) for p in report["pairs"]] == [
        ("ours-sasrec", "recbole-SASRec"),
        ("ours-youtubednn", "deepmatch-YouTubeDNN"),
    ]
    table = (out / "results.md").read_text()
    assert "recbole | SASRec" in table and "deepmatch | YouTubeDNN" in table


def test_the_runners_epoch_loop_times_training_exports_each_epoch_and_stops_at_the_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runners/epochs.py``: only ``train`` is timed, every epoch is exported and recorded, and
    the epoch whose training passes ``max_minutes`` is the last."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("epochs", peers.RUNNERS / "epochs.py")
    assert spec is not None and spec.loader is not None
    epochs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(epochs)
    clock = iter([0.0, 40.0, 40.0, 100.0, 100.0, 1000.0])  # epoch 1 trains 40 s, epoch 2 60 s
    monkeypatch.setattr(epochs.time, "perf_counter", lambda: next(clock))
    exported: list[str] = []
    progress: dict = {"epochs": [], "done": False}

    def export(folder: Path) -> None:
        assert folder.is_dir()
        exported.append(folder.name)

    epochs.train_epochs(tmp_path, progress, 5, 1.5, lambda n: 10.0 / n, export)
    assert exported == ["epoch_001", "epoch_002"]  # 40 + 60 s passed 1.5 minutes: stopped
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written == progress
    assert written["epochs"] == [
        {"epoch": 1, "train_seconds": 40.0, "loss": 10.0},
        {"epoch": 2, "train_seconds": 60.0, "loss": 5.0},
    ]
    assert written["done"] and written["stopped_by_time"]
