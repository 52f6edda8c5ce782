"""Evaluation: brute-force retrieval, the popularity baseline and the three protocols against
naive references, and tools/evaluate.py end to end on a tiny trained model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrieval.artifacts.model import ModelArtifact, encode_histories, pad_left
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.splits import comirec_split, sample_negatives
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation import evaluate as evaluate_module
from retrieval.evaluation.evaluate import (
    candidate_scores,
    category_codes,
    exact_top_k,
    mask_excluded,
    popularity_top_k,
)
from retrieval.evaluation.paired import (
    USER_METRICS_FILE,
    UserMetrics,
    compare_user_metrics,
    paired_comparison,
)
from retrieval.evaluation.protocols import evaluate_model_on_data, evaluate_protocol
from tests.helpers import run_tool


def test_exact_top_k_matches_a_naive_loop() -> None:
    rng = np.random.default_rng(0)
    interests, items = rng.normal(size=(300, 3, 8)), rng.normal(size=(41, 8))
    exclude = [rng.choice(np.arange(1, 41), size=rng.integers(0, 10), replace=False) for _ in range(300)]
    got = exact_top_k(interests, items, exclude, 7)
    for u in range(300):
        best = {
            v: max(interests[u, k] @ items[v] for k in range(3)) for v in range(1, 41) if v not in exclude[u]
        }
        expected = sorted(best, key=lambda v: -best[v])[:7]
        assert got[u].tolist() == expected


@pytest.mark.parametrize("interests_per_user", [1, 3])
def test_exact_top_k_is_the_same_in_any_batch_size(
    monkeypatch: pytest.MonkeyPatch, interests_per_user: int
) -> None:
    rng = np.random.default_rng(1)
    interests = rng.normal(size=(50, interests_per_user, 8)).astype(np.float32)
    interests[7] = 0.0  # every interest masked: nothing is retrievable
    items = rng.normal(size=(30, 8)).astype(np.float32)
    exclude = [rng.choice(np.arange(30), size=rng.integers(0, 8), replace=False) for _ in range(50)]
    whole = exact_top_k(interests, items, exclude, 6)
    monkeypatch.setattr(evaluate_module, "_SCORES_PER_BATCH", 30 * 4)  # 4 users at a time
    assert np.array_equal(exact_top_k(interests, items, exclude, 6), whole)
    assert whole[7].tolist() == [-1] * 6
    assert all(not set(whole[u]) & set(exclude[u].tolist()) for u in range(50))


def test_equal_scores_rank_the_lower_id_first() -> None:
    items = np.array([[0.0], [1.0], [2.0], [1.0], [2.0], [1.0]], np.float32)
    got = exact_top_k(np.ones((1, 1, 1), np.float32), items, [np.array([3])], 4)
    assert got.tolist() == [[2, 4, 1, 5]]


def test_small_catalogue_pads_with_minus_one() -> None:
    items = np.eye(4)  # rows 1..3 are items
    got = exact_top_k(np.array([[[0.0, 3.0, 2.0, 1.0]]]), items, [np.array([2])], 5)
    assert got.tolist() == [[1, 3, -1, -1, -1]]  # item 2 (score 2) is excluded


def test_popularity_excludes_each_users_history() -> None:
    counts = np.array([0, 5, 9, 1, 7])
    got = popularity_top_k(counts, [np.array([], int), np.array([2, 4])], 3)
    assert got.tolist() == [[2, 4, 1], [1, 3, -1]]


def test_candidate_scores_match_a_naive_loop() -> None:
    rng = np.random.default_rng(3)
    interests, items = rng.normal(size=(5, 3, 4)), rng.normal(size=(20, 4))
    interests[1, 2] = 0.0  # a masked interest never scores
    candidates = rng.integers(0, 20, size=(5, 7))  # id 0 (padding) scores -inf
    got = candidate_scores(interests, items, candidates, batch=2)
    for u in range(5):
        active = [k for k in range(3) if np.any(interests[u, k] != 0)]
        for c, v in enumerate(candidates[u]):
            expected = -np.inf if v == 0 else max(interests[u, k] @ items[v] for k in active)
            assert got[u, c] == pytest.approx(expected, rel=1e-5)


def test_category_codes_share_a_category_and_keep_unknown_items_apart() -> None:
    codes = category_codes({1: "Drama", 2: "Comedy", 4: "Drama"}, 6)
    assert codes[1] == codes[4] != codes[2]
    assert len({int(codes[i]) for i in (0, 2, 3, 5)} | {int(codes[1])}) == 5  # 0, 3, 5: own codes


# --- protocols on a hand-made dataset, with a numpy "model" (no TensorFlow) -------------------

NUM_ITEMS, DIM, MAX_LEN = 80, 6, 8


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 users over items 1..80 in S3-Rec format, 3..15 events each, attributes (category, brand)."""
    rng = np.random.default_rng(11)
    folder = tmp_path_factory.mktemp("toy")
    lines = [
        f"{u} " + " ".join(map(str, rng.integers(1, NUM_ITEMS + 1, size=rng.integers(3, 16))))
        for u in range(1, 41)
    ]
    (folder / "Toy.txt").write_text("\n".join(lines) + "\n")
    attributes = {str(i): [f"c{i % 5}", f"b{i % 3}"] for i in range(1, NUM_ITEMS + 1) if i != 7}  # 7: none
    (folder / "Toy_item2attributes.json").write_text(json.dumps(attributes))
    return folder / "Toy.txt"


def _numpy_model(known: list[str]) -> ModelArtifact:
    """Two interests: the mean of the history's embeddings and the last item's (zero, i.e. masked,
    for an empty history). The vocabulary is in another order than the data's."""
    table = np.random.default_rng(5).normal(size=(len(known) + 1, DIM)).astype(np.float32)
    table[0] = 0.0

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        items = inputs["items"]
        mean = table[items].sum(axis=1) / np.maximum((items != 0).sum(axis=1, keepdims=True), 1)
        return np.stack([mean, table[items[:, -1]]], axis=1)

    manifest = {"version": "numpy", "max_len": MAX_LEN, "num_interests": 2}
    return ModelArtifact(None, manifest, ItemVocab.from_ids(known), table, user_vectors)


@pytest.fixture(scope="module")
def numpy_model() -> ModelArtifact:
    known = [str(i) for i in range(NUM_ITEMS, 0, -1) if i != 3]  # item 3 is unknown to the model
    return _numpy_model(known)


def _oracle_top(model: ModelArtifact, history: list[str], n: int) -> tuple[list[int], set[int]]:
    """Brute force over external ids: the top-n model ids by best interest, history excluded."""
    dense = [int(i) for i in model.vocab.lookup(history) if i != 0]
    interests = model.user_vectors({"items": pad_left([np.array(dense)], MAX_LEN)})[0]
    active = [k for k in interests if np.any(k != 0)]
    scores = {
        v: max(float(k @ model.item_embeddings[v]) for k in active) for v in range(1, len(model.vocab) + 1)
    }
    ranked = sorted((v for v in scores if v not in dense), key=lambda v: -scores[v])
    return ranked[:n], set(dense)


def test_comirec_protocol_against_brute_force(toy_data: Path, numpy_model: ModelArtifact) -> None:
    result = evaluate_protocol(numpy_model, toy_data, "comirec", seed=5)
    data = build_sequences(load_interactions(toy_data))
    split = comirec_split(data.sequences, seed=5)
    assert result.users == len(split.test_users) == 4 and result.settings["train_users"] == 32
    attributes = json.loads((toy_data.parent / "Toy_item2attributes.json").read_text())
    for n in (20, 50):
        recall = ndcg = hit = diversity = 0.0
        for h, t in zip(split.test_histories, split.test_targets, strict=True):
            top, _ = _oracle_top(numpy_model, data.vocab.external(h), n)
            top_ext = numpy_model.vocab.external(top)
            hits = [e in top_ext for e in data.vocab.external(t)]  # unknown item 3: never in top
            dcg = sum(1 / np.log2(j + 2) for j, x in enumerate(hits) if x)
            idcg = sum(1 / np.log2(j + 2) for j in range(sum(hits)))
            recall, hit = recall + sum(hits) / len(hits), hit + any(hits)
            ndcg += dcg / idcg if idcg else 0.0
            # first attribute = category; item 7 has none, so it differs from every item
            cats = [attributes[e][0] if e in attributes else f"own-{e}" for e in top_ext]
            pairs = [(a, b) for i, a in enumerate(cats) for b in cats[i + 1 :]]
            diversity += np.mean([a != b for a, b in pairs])
        assert result.metrics[f"recall@{n}"] == pytest.approx(recall / 4)
        assert result.metrics[f"hitrate@{n}"] == pytest.approx(hit / 4)
        assert result.metrics[f"ndcg@{n}"] == pytest.approx(ndcg / 4)
        assert result.metrics[f"diversity@{n}"] == pytest.approx(diversity / 4)


def test_comirec_protocol_scores_the_test_fold_asked_for(toy_data: Path, numpy_model: ModelArtifact) -> None:
    data = build_sequences(load_interactions(toy_data))
    scored = 0
    for fold in range(4):
        result = evaluate_protocol(numpy_model, toy_data, "comirec", seed=5, folds=4, fold=fold)
        split = comirec_split(data.sequences, seed=5, folds=4, fold=fold)
        assert result.users == len(split.test_users)
        assert (result.settings["folds"], result.settings["fold"]) == (4, fold)
        scored += result.users
    assert scored == sum(len(s) >= 2 for s in data.sequences)  # every user that can be split, once
    with pytest.raises(ValueError, match="comirec protocol only"):
        evaluate_protocol(numpy_model, toy_data, "loo", folds=2)


def test_loo_sampled_protocol_against_brute_force(toy_data: Path, numpy_model: ModelArtifact) -> None:
    result = evaluate_protocol(numpy_model, toy_data, "loo-sampled", split="valid", seed=2, num_negatives=30)
    assert set(result.metrics) == {"sampled_hr@10", "sampled_ndcg@10"}
    assert result.settings == {"seed": 2, "negatives": 30} and result.users == 40
    data = build_sequences(load_interactions(toy_data))
    to_model = np.concatenate([[0], numpy_model.vocab.lookup(list(data.vocab.ids))])
    negatives = sample_negatives([to_model[s] for s in data.sequences], len(numpy_model.vocab), 30, seed=2)
    hr = ndcg = 0.0
    for seq, negs in zip(data.sequences, negatives, strict=True):
        history, target = data.vocab.external(seq[:-2]), data.vocab.external(seq[-2:-1])[0]
        dense = [int(i) for i in numpy_model.vocab.lookup(history) if i != 0]
        assert not np.isin(negs, to_model[seq]).any()  # never the user's items nor the target
        interests = numpy_model.user_vectors({"items": pad_left([np.array(dense)], MAX_LEN)})[0]
        active = [k for k in interests if np.any(k != 0)]

        def score(v: int, active: list[np.ndarray] = active) -> float:
            return max(float(k @ numpy_model.item_embeddings[v]) for k in active)

        t = int(numpy_model.vocab.lookup([target])[0])
        rank = len(negs) if t == 0 else sum(score(v) >= score(t) for v in negs)
        hr, ndcg = hr + (rank < 10), ndcg + (1 / np.log2(rank + 2) if rank < 10 else 0.0)
    assert result.metrics["sampled_hr@10"] == pytest.approx(hr / 40)
    assert result.metrics["sampled_ndcg@10"] == pytest.approx(ndcg / 40)


def test_loo_protocol_is_the_existing_evaluation(toy_data: Path, numpy_model: ModelArtifact) -> None:
    result = evaluate_protocol(numpy_model, toy_data, "loo")
    assert result.metrics == evaluate_model_on_data(numpy_model, toy_data)
    assert {"hr@5", "ndcg@5", "recall@5", "hr@50", "ndcg@50", "recall@50"} <= set(result.metrics)
    data = build_sequences(load_interactions(toy_data))
    hits = 0
    for seq in data.sequences:
        top, _ = _oracle_top(numpy_model, data.vocab.external(seq[:-1]), 10)
        hits += data.vocab.external(seq[-1:])[0] in numpy_model.vocab.external(top)
    assert result.metrics["hr@10"] == pytest.approx(hits / 40)


def test_protocol_arguments_are_checked(toy_data: Path, numpy_model: ModelArtifact) -> None:
    with pytest.raises(ValueError, match="unknown protocol"):
        evaluate_protocol(numpy_model, toy_data, "sampled")
    with pytest.raises(ValueError, match="index does not apply"):
        evaluate_protocol(numpy_model, toy_data, "loo-sampled", index=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="items left"):
        evaluate_protocol(numpy_model, toy_data, "loo-sampled", num_negatives=100)  # 79 known items


# --- tools/evaluate.py on a tiny trained model -------------------------------------------------


@pytest.fixture(scope="module")
def trained_toy(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ComiRec-SA with K = 2 trained one epoch on the toy data through tools/train.py."""
    out = tmp_path_factory.mktemp("toy-model") / "model"
    args = ["--data", str(toy_data), "--out", str(out), "--model", "sa", "--num-interests", "2"]
    args += ["--epochs", "1", "--dim", "8", "--max-len", str(MAX_LEN), "--negatives", "8", "--quiet"]
    assert run_tool("train", *args) == 0
    return out


def test_tool_evaluates_each_protocol_and_compares_runs(
    trained_toy: Path, toy_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = {
        "loo": {f"{m}@{k}" for m in ("hr", "ndcg", "recall") for k in (5, 10, 20, 50)},
        "loo-sampled": {"sampled_hr@10", "sampled_ndcg@10"},
        "comirec": {f"{m}@{k}" for m in ("recall", "hitrate", "ndcg", "diversity") for k in (20, 50)},
    }
    base = ["--model", str(trained_toy), "--data", str(toy_data)]
    for protocol, keys in expected.items():
        out = tmp_path / protocol
        assert (
            run_tool("evaluate", *base, "--protocol", protocol, "--negatives", "20", "--out", str(out)) == 0
        )
        printed = json.loads(capsys.readouterr().out)
        saved = json.loads((out / "metrics.json").read_text())
        assert printed == saved and saved["protocol"] == protocol and saved["split"] == "test"
        assert {k for k in saved if "@" in k} == keys
        assert all(0.0 <= saved[k] <= 1.0 for k in keys)
    # The default protocol is loo, printed as JSON as before.
    assert run_tool("evaluate", *base) == 0
    legacy = json.loads(capsys.readouterr().out)
    assert legacy["search"] == "exact" and legacy["ndcg@10"] == saved_metric(tmp_path, "loo", "ndcg@10")

    assert run_tool("evaluate", *base, "--protocol", "comirec", "--table") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| run | protocol | split | recall@20 | recall@50 | hitrate@20")
    assert f"| {trained_toy} | comirec | test |" in table[2]

    runs = [str(tmp_path / p) for p in expected] + [str(trained_toy)]
    assert run_tool("evaluate", "--compare", *runs) == 0
    sections = capsys.readouterr().out.strip().split("\n\n### ")  # one table per protocol
    assert [s.splitlines()[0].removeprefix("### ") for s in sections] == list(expected)
    loo_full = sections[0].splitlines()[2:]
    assert len(loo_full) == 2 + 3  # header, rule; the evaluation, the training run, its baseline
    assert loo_full[-1].startswith(f"| {trained_toy} (most popular) | loo | test |")
    assert run_tool("evaluate", "--compare", *runs[:2], "--metrics", "ndcg@10,sampled_ndcg@10") == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == "| run | protocol | split | ndcg@10 | sampled_ndcg@10 |"
    assert rows[-1].endswith("| – | " + f"{saved_metric(tmp_path, 'loo-sampled', 'sampled_ndcg@10'):.4f} |")


def saved_metric(folder: Path, protocol: str, key: str) -> float:
    return float(json.loads((folder / protocol / "metrics.json").read_text())[key])


def test_tool_refuses_bad_requests(trained_toy: Path, toy_data: Path, tmp_path: Path) -> None:
    base = ["--model", str(trained_toy), "--data", str(toy_data)]
    assert run_tool("evaluate", *base, "--out", str(trained_toy)) == 2  # never into an artifact
    assert run_tool("evaluate", *base, "--protocol", "loo-sampled") == 2  # 100 negatives: too few items
    assert run_tool("evaluate", "--compare", str(tmp_path / "missing")) == 2
    with pytest.raises(SystemExit):
        run_tool("evaluate", "--data", str(toy_data))  # --model missing


@pytest.mark.slow  # each trains and exports a model: 4 s of CPU
@pytest.mark.parametrize(
    ("tower", "fusion", "side"), [("sasrec", "nova", "gap_prev"), ("bert4rec", "none", "")]
)
def test_length_sorted_trimmed_encoding_equals_full_width(
    synthetic_csv: Path, tmp_path: Path, tower: str, fusion: str, side: str
) -> None:
    """encode_histories batches similar lengths in trimmed widths: the interests of an exported
    tower are those of full-width, unsorted encoding (towers ignore padding)."""
    from retrieval.artifacts.model import load_model
    from retrieval.config import apply_overrides
    from retrieval.training.config import Config
    from retrieval.training.run import train

    overrides = [f"data.path={synthetic_csv}", f"model.tower={tower}", f"model.fusion={fusion}"]
    overrides += [f"model.side_features={side}", "model.dim=8", "model.max_len=24", "train.epochs=1"]
    overrides += ["model.num_blocks=1"]  # one block ignores padding or not as two do: 2.5 s less
    config = apply_overrides(Config(), [*overrides, "train.num_negatives=8", "train.batch_size=16"])
    train(config, tmp_path / "m", verbose=0)
    model = load_model(tmp_path / "m")
    rng = np.random.default_rng(3)
    histories = [rng.integers(1, len(model.vocab) + 1, n) for n in rng.integers(1, 40, 50)]
    features = None
    if side:
        features = {side: [rng.integers(1, 4, len(h)) for h in histories]}
    got = encode_histories(model, histories, features, batch_size=7)
    want = np.concatenate(
        [
            model.encode([h], None if features is None else {side: [features[side][i]]})
            for i, h in enumerate(histories)
        ]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_paired_comparison_against_hand_worked_values() -> None:
    a, b = np.array([1.0, 0.0, 0.5, 1.0]), np.array([0.0, 0.0, 0.5, 0.5])
    c = paired_comparison(a, b)
    # d = a - b = [1, 0, 0, 0.5]: mean 0.375, se = sqrt(sum((d - 0.375)^2) / 3) / sqrt(4).
    se = np.sqrt((0.625**2 + 0.375**2 + 0.375**2 + 0.125**2) / 3) / 2
    assert (c.users, c.mean_a, c.mean_b) == (4, 0.625, 0.25)
    assert (c.difference, c.se) == pytest.approx((0.375, se))
    assert (c.low, c.high) == pytest.approx((0.375 - 1.959964 * se, 0.375 + 1.959964 * se))
    # R = 0.625 / 0.25 = 2.5; a - R b = [1, 0, -0.75, -0.25], mean 0, sample variance 1.625 / 3;
    # relative se = sqrt(1.625 / 3) / (sqrt(4) * 0.25).
    assert c.relative == pytest.approx(1.5)
    assert c.relative_se == pytest.approx(np.sqrt(1.625 / 3) / 0.5)
    low, high = c.relative_interval
    assert (low + high) / 2 == pytest.approx(1.5) and high - low == pytest.approx(
        2 * 1.959964 * c.relative_se
    )
    assert np.isnan(paired_comparison(a, np.zeros(4)).relative)
    with pytest.raises(ValueError, match="at least 2 users"):
        paired_comparison(a[:1], b[:1])


def test_paired_errors_match_a_bootstrap_over_users() -> None:
    # Recall-like values of two models on 3,000 users of varied difficulty, correlated by user.
    rng = np.random.default_rng(0)
    difficulty = rng.beta(0.5, 2.0, size=3000)
    b = rng.binomial(10, difficulty) / 10
    a = np.clip(b + rng.binomial(1, 0.08, size=3000) * 0.1 - rng.binomial(1, 0.03, size=3000) * 0.1, 0, 1)
    c = paired_comparison(a, b)
    draws = rng.integers(0, 3000, size=(2000, 3000))  # users resampled with replacement
    differences = a[draws].mean(axis=1) - b[draws].mean(axis=1)
    ratios = a[draws].mean(axis=1) / b[draws].mean(axis=1) - 1
    assert c.se == pytest.approx(differences.std(), rel=0.08)
    assert c.relative_se == pytest.approx(ratios.std(), rel=0.08)
    # Unpaired errors (each model's own) would be several times larger: pairing is what helps.
    assert np.hypot(a.std(ddof=1), b.std(ddof=1)) / np.sqrt(3000) > 3 * c.se


def test_user_metrics_round_trip_and_pair_by_user_id(tmp_path: Path) -> None:
    users = ("u,1", 'u"2', "u3", "u4")  # ids CSV must quote
    a = UserMetrics(
        users, {"recall@50": np.array([0.1, 1 / 3, 0.0, 1.0]), "ndcg@50": np.array([0.2, 0.3, 0.0, 0.9])}
    )
    a.save(tmp_path / "a.csv")
    back = UserMetrics.load(tmp_path / "a.csv")
    assert back.users == users
    for m in a.values:
        np.testing.assert_array_equal(back.values[m], a.values[m])  # exact floats
    (tmp_path / "run").mkdir()
    a.save(tmp_path / "run" / USER_METRICS_FILE)
    assert UserMetrics.load(tmp_path / "run").users == users  # a run folder
    # b holds the same users in another order: pairing goes by id, not by position.
    order = [2, 0, 3, 1]
    b_values = {"recall@50": np.array([0.0, 0.2, 0.5, 0.6]), "ndcg@50": np.array([0.1, 0.1, 0.1, 0.1])}
    b = UserMetrics(tuple(users[i] for i in order), {m: v[order] for m, v in b_values.items()})
    got = compare_user_metrics(a, b, ["recall@50"])
    assert list(got) == ["recall@50"]
    expected = paired_comparison(a.values["recall@50"], b_values["recall@50"])
    assert got["recall@50"] == expected
    assert list(compare_user_metrics(a, b)) == ["recall@50", "ndcg@50"]
    # Folds pool, seeds average.
    pooled = UserMetrics.concat(
        [
            UserMetrics(users[:2], {"r": np.array([1.0, 0.0])}),
            UserMetrics(users[2:], {"r": np.array([0.5, 0.5])}),
        ]
    )
    assert pooled.users == users and pooled.means() == {"r": 0.5}
    mean = UserMetrics.average(
        [
            UserMetrics(users[:2], {"r": np.array([1.0, 0.0])}),
            UserMetrics(users[1::-1], {"r": np.array([1.0, 0.0])}),
        ]
    )
    np.testing.assert_allclose(mean.values["r"], [0.5, 0.5])
    with pytest.raises(ValueError, match="different users"):
        compare_user_metrics(a, UserMetrics(users[:3], {m: v[:3] for m, v in a.values.items()}))
    with pytest.raises(ValueError, match="not measured by both"):
        compare_user_metrics(a, b, ["hitrate@50"])
    with pytest.raises(ValueError, match="more than once"):
        UserMetrics.concat([pooled, pooled])
    with pytest.raises(ValueError, match="values for 4 users"):
        UserMetrics(users, {"r": np.zeros(3)})
    (tmp_path / "bad.csv").write_text("id,r\nx,1\n")
    with pytest.raises(ValueError, match="cannot read per-user metrics"):
        UserMetrics.load(tmp_path / "bad.csv")


def test_mask_excluded_masks_padding_and_each_row_s_own_ids() -> None:
    scores = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = mask_excluded(scores, [np.array([2, 3]), np.array([], np.int64), np.array([[1]])])
    assert out is scores
    expected = np.arange(12, dtype=np.float64).reshape(3, 4)
    expected[:, 0] = expected[0, [2, 3]] = expected[2, 1] = -np.inf
    np.testing.assert_array_equal(scores, expected)
    none = mask_excluded(np.ones((2, 3)), [np.array([], np.int64)] * 2)
    np.testing.assert_array_equal(none, [[-np.inf, 1, 1], [-np.inf, 1, 1]])
