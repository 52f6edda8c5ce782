"""``bench/cold_start.py``: the held-out split, what the trainer is given, the cold test users, the
ranks against a numpy oracle, and the protocol end to end with the training replaced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import cold_start, quality
from retrieval.artifacts.model import ModelArtifact
from retrieval.data import SideVocab, build_sequences, load_interactions
from retrieval.data.vocab import ItemVocab

DIM = 16


@pytest.fixture
def s3rec(tmp_path: Path) -> Path:
    """An S3-Rec file with attributes: 80 users over 50 items in 5 clusters of 10; each item has
    its cluster's attribute and one of 3 shared ones; item 49 has only an attribute no other
    item has (when held out, the model cannot know it)."""
    rng = np.random.default_rng(3)
    lines = []
    for user in range(80):
        cluster = int(rng.integers(5))
        items = cluster * 10 + rng.choice(10, size=int(rng.integers(2, 9)), replace=False)
        lines.append(" ".join([str(user), *map(str, items)]))
    path = tmp_path / "data" / "Toy.txt"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    attributes: dict[str, list[Any]] = {str(i): [f"c{i // 10}", f"s{i % 3}"] for i in range(49)}
    attributes["49"] = ["only49"]
    (path.parent / "Toy_item2attributes.json").write_text(json.dumps(attributes))
    return path


def _sequences(path: Path) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in path.read_text().splitlines()}


def test_held_out_items_never_reach_training_and_cold_users_are_those_going_to_one(
    s3rec: Path, tmp_path: Path
) -> None:
    original = _sequences(s3rec)
    items = sorted({i for s in original.values() for i in s})
    held = cold_start.hold_out(str(s3rec), 0.2, 5, tmp_path / "out")
    assert len(held.items) == round(0.2 * len(items)) and set(held.items) <= set(items)
    assert held.items == cold_start.hold_out(str(s3rec), 0.2, 5, tmp_path / "again").items  # seeded
    assert held.items != cold_start.hold_out(str(s3rec), 0.2, 6, tmp_path / "other").items

    reduced = _sequences(held.data_path)
    assert not {i for s in reduced.values() for i in s} & set(held.items)
    expected = {u: [i for i in s if i not in held.items] for u, s in original.items()}
    assert reduced == {u: s for u, s in expected.items() if s}  # order kept, emptied users gone
    attributes = json.loads((held.data_path.parent / "data_item2attributes.json").read_text())
    assert not set(attributes) & set(held.items)

    # Cold users: 3+ events and the real last one held out, read from the original file here.
    cold = {u: s for u, s in original.items() if len(s) >= 3 and s[-1] in held.items}
    kept = {u: s for u, s in cold.items() if any(i not in held.items for i in s[:-1])}
    assert held.cold.users == tuple(kept) and held.cold.dropped == len(cold) - len(kept)
    assert held.cold.targets == tuple(s[-1] for s in kept.values())
    assert held.cold.histories == tuple(tuple(s[:-1]) for s in kept.values())
    assert held.warm_users == sum(len(s) >= 3 for s in reduced.values())
    # Popularity counts: the reduced sequences' training part (all but the last two of 3+).
    train = [i for s in reduced.values() for i in (s[:-2] if len(s) >= 3 else s)]
    assert held.counts == {i: train.count(i) for i in held.counts}
    assert set(held.counts) == {i for s in reduced.values() for i in s}


def test_target_ranks_match_a_sorting_oracle() -> None:
    rng = np.random.default_rng(0)
    users, items = 300, 40  # more users than one batch
    scores = rng.normal(size=(users, items))
    exclude = [
        rng.choice(np.arange(1, items), size=int(rng.integers(0, 6)), replace=False) for _ in range(users)
    ]
    targets = rng.integers(1, items, size=users)
    ranks = cold_start.target_ranks(lambda rows: scores[rows], exclude, targets)
    for u in range(users):
        if targets[u] in exclude[u]:
            assert ranks[u] == items - 1  # a miss: after every item
            continue
        shown = [j for j in range(1, items) if j not in set(exclude[u].tolist())]
        order = sorted(shown, key=lambda j: -scores[u, j])
        assert ranks[u] == order.index(targets[u])
    assert (ranks == items - 1).any() and (ranks == 0).any()
    # Ties count against the target: all alike -> behind every other item shown.
    flat = cold_start.target_ranks(lambda rows: np.zeros((1, 5)), [np.zeros(0, np.int64)], np.array([2]))
    assert flat.tolist() == [3]
    # ... and so do scores a float32 rounding below it (equal vectors, summed in another order).
    below = np.float64(np.nextafter(np.float32(2.5), np.float32(0)))
    near = cold_start.target_ranks(
        lambda rows: np.array([[0, below, 2.5, 1.0]]), [np.zeros(0, np.int64)], np.array([2])
    )
    assert near.tolist() == [1]
    metrics = cold_start.rank_metrics(np.array([0, 9, 10, 49, 50]))
    assert metrics["hr@10"].tolist() == [1, 1, 0, 0, 0] and metrics["recall@50"].tolist() == [1, 1, 1, 1, 0]
    np.testing.assert_allclose(metrics["ndcg@50"], [1, 1 / np.log2(11), 1 / np.log2(12), 1 / np.log2(51), 0])


def _artifact(vocab: ItemVocab, attributes: dict[str, tuple[str, ...]], seed: int) -> ModelArtifact:
    """A model without TensorFlow: each attribute a random vector, each item its attributes' mean
    plus a small id part, a user the mean of its history's vectors (one interest)."""
    rng = np.random.default_rng(seed)
    names = sorted({a for i in vocab.ids for a in attributes.get(i, ())})
    table = rng.normal(size=(len(names) + 1, DIM)).astype(np.float32)
    table[0] = 0
    index = {a: n + 1 for n, a in enumerate(names)}
    items = np.zeros((len(vocab) + 1, DIM), np.float32)
    for n, i in enumerate(vocab.ids):
        rows = [index[a] for a in attributes[i]]
        items[n + 1] = table[rows].mean(axis=0) + 0.1 * rng.normal(size=DIM)

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        ids = inputs["items"]
        real = (ids > 0)[..., None]
        return ((items[ids] * real).sum(axis=1) / np.maximum(real.sum(axis=1), 1))[:, None, :]

    manifest = {"kind": "model", "version": "toy", "max_len": 20, "num_interests": 1, "dim": DIM}
    side = SideVocab(("attributes",), (), tuple(names), 2)
    return ModelArtifact(None, manifest, vocab, items, user_vectors, side, None, table)


def test_protocol_end_to_end_with_a_stand_in_trainer(
    s3rec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench.cold_start`` with training replaced: the trainer is given the reduced
    data only, and the cold path's ranks are those of a numpy oracle over warm + cold vectors."""
    given: list[Any] = []
    every = json.loads((s3rec.parent / "Toy_item2attributes.json").read_text())

    def fake_train(config: Any, out: Path, **kwargs: Any) -> Any:
        given.append(config)
        data = build_sequences(load_interactions(config.data.path))
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config.to_dict()))
        metrics = {"hr@50": 0.5, "ndcg@50": 0.2, "hr@10": 0.3, "ndcg@10": 0.1}
        payload = {
            "test": metrics,
            "baseline_popularity_test": metrics,
            "train_seconds": 1.0,
            "epochs_trained": 1,
        }
        (out / "metrics.json").write_text(json.dumps(payload))
        (out / "vocab.json").write_text(json.dumps(list(data.vocab.ids)))

        class Result:
            def to_dict(self) -> dict[str, Any]:
                return payload

        return Result()

    models: dict[str, ModelArtifact] = {}

    def fake_load(folder: Path) -> ModelArtifact:
        vocab = ItemVocab.from_ids(json.loads((Path(folder) / "vocab.json").read_text()))
        attributes = {i: tuple(every[i]) for i in vocab.ids}
        models[str(folder)] = _artifact(vocab, attributes, seed=len(models))
        return models[str(folder)]

    monkeypatch.setattr(quality, "train", fake_train)
    monkeypatch.setattr(cold_start, "load_model", fake_load)
    out = tmp_path / "cold"
    argv = [
        "--datasets",
        str(s3rec),
        "--hold-out",
        "0.3",
        "--split-seed",
        "5",
        "--seeds",
        "1",
        "2",
    ]
    assert (
        cold_start.main([*argv, "--id-dropout", "0.5", "0", "--epochs", "1", "--out", str(out), "--quiet"])
        == 0
    )

    held = cold_start.hold_out(str(s3rec), 0.3, 5, tmp_path / "check")
    # Split seed 5 holds out item 49, whose one attribute no trained item has, and some user's
    # last item is 49: a target without a vector (a miss), and two users with nothing warm to read.
    assert "49" in held.items and "49" in held.cold.targets and held.cold.dropped == 2
    assert [(c.model.id_dropout, c.train.seed) for c in given] == [(0.5, 1), (0.5, 2), (0.0, 1), (0.0, 2)]
    for config in given:
        assert (config.model.tower, config.model.fusion, config.model.side_features) == (
            "sasrec",
            "nova",
            "attributes",
        )
        trained = build_sequences(load_interactions(config.data.path))
        assert not set(trained.vocab.ids) & set(held.items)  # the trainer never sees a held-out item
    report = json.loads((out / "results.json").read_text())
    assert report["meta"]["command"].startswith("python -m bench.cold_start")
    info = report["datasets"]["Toy"]
    assert (info["held_out"], info["cold_users"]) == (len(held.items), len(held.cold.users))
    assert (info["without_vector"], info["dropped_users"]) == (1, 2)

    # The oracle: per cold user, warm items' vectors + mean attribute vectors of held-out items.
    for run in report["runs"]:
        model = models[run["folder"]]
        position = {i: n + 1 for n, i in enumerate(model.vocab.ids)}
        index = {a: n + 1 for n, a in enumerate(model.side.attributes)}
        ranks = []
        for history, target in zip(held.cold.histories, held.cold.targets, strict=True):
            read = [position[i] for i in history if i in position]
            user = model.item_embeddings[read].mean(axis=0)
            scores = {
                i: float(model.item_embeddings[n] @ user) for i, n in position.items() if i not in history
            }
            for i in held.items:
                known = [index[a] for a in every[i] if a in index]
                if known and i not in history:
                    scores[i] = float(model.attribute_embeddings[known].mean(axis=0) @ user)
            ranks.append(
                sum(s >= scores[target] for i, s in scores.items() if i != target)
                if target in scores
                else len(model.vocab) + len(held.items)
            )
        expected = cold_start.rank_metrics(np.array(ranks))
        for metric in ("recall@50", "ndcg@50", "hr@10", "ndcg@10"):
            assert run["cold"]["cold path"][metric] == pytest.approx(expected[metric].mean(), abs=1e-9)
        assert run["cold"]["cold path"]["median_rank"] == np.median(ranks)
        # Popularity: a held-out target has no training event, so it is never in the top 10.
        assert run["cold"]["popularity"]["hr@10"] == 0.0
    markdown = (out / "results.md").read_text()
    assert "### Toy: held-out targets" in markdown and "| cold path | 0.5 | 2 |" in markdown
    assert "| model | 0 | 2 | 0.5000 ± 0.0000 |" in markdown
