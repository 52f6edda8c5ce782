"""Pre-ranking: click examples, AUC/GAUC, the ranker artifact, training and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
import threading
from itertools import product
from pathlib import Path

import keras
import numpy as np
import pytest

from rankers import build_ranker
from retrieval.artifacts.index import build_index_from_model, load_index
from retrieval.artifacts.model import ModelArtifact, load_model, pad_left
from retrieval.artifacts.ranker import load_ranker, save_ranker
from retrieval.artifacts.ranker_inputs import AttributeTable
from retrieval.artifacts.ranker_scorer import RankerScorer
from retrieval.config import apply_overrides
from retrieval.data.interactions import SequenceData, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.splits import leave_one_out
from retrieval.data.vocab import ItemVocab
from retrieval.evaluation.evaluate import evaluate_ranking
from retrieval.evaluation.protocols import evaluate_protocol
from retrieval.ranking.blend import fit_bias, fit_blend, fit_list_blend, list_loss
from retrieval.ranking.config import RankerConfig, check_config, negative_counts
from retrieval.ranking.data import build_ranking_data, retrieve
from retrieval.ranking.metrics import auc, evaluate_reranking, gauc, list_metrics, per_user_auc
from retrieval.ranking.training import RankerMetrics, ranker_kwargs, train_ranker
from retrieval.storage.manifest import ArtifactError
from tests.helpers import run_tool

TINY = {"din": {"attention_units": [8], "hidden_units": [16], "activation": "prelu"}}


def fake_model(data: SequenceData, dim: int = 8, seed: int = 0, num_interests: int = 1) -> ModelArtifact:
    """A retrieval model without training: random item vectors, the user = mean of the history's
    (and, with 2 interests, the newest item's vector as the second)."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(data.vocab.num_embeddings, dim)).astype(np.float32)
    table[0] = 0.0

    def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
        items = inputs["items"]
        valid = (items > 0)[..., None]
        mean = (table[items] * valid).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)
        heads = [mean, table[items[:, -1]]][:num_interests]
        return np.stack(heads, axis=1).astype(np.float32)  # [B, K, d]

    manifest = {"version": "fake-1", "max_len": 8, "num_interests": num_interests}
    return ModelArtifact(None, manifest, data.vocab, table, user_vectors)


def cluster_attributes(vocab: ItemVocab) -> AttributeTable:
    """The synthetic log's items i0..i39 sit in clusters of 10: attribute = the cluster."""
    return AttributeTable.from_external(vocab, {i: [f"c{int(i[1:]) // 10}"] for i in vocab.ids})


@pytest.fixture(scope="module")
def setup(synthetic_csv: Path):
    data = build_sequences(load_interactions(synthetic_csv))
    model = fake_model(data)
    return data, model, build_index_from_model(model)


# --- click examples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("negatives", "positives_only"),
    [("retrieved", True), ("retrieved", False), ("uniform", False), ("retrieved+popularity", False)],
)
def test_click_examples_are_prefixes_with_clean_negatives(
    setup, negatives: str, positives_only: bool
) -> None:
    data, model, index = setup
    config = RankerConfig(
        negatives=negatives, num_negatives=6, positions_per_user=4, candidates=12, max_len=6,
        num_unclicked=3, retrieved_positives_only=positives_only,
    )  # fmt: skip
    ranking = build_ranking_data(model, index, data, config)
    train = leave_one_out(data).train  # the synthetic data's ids are the model's (same vocabulary)
    examples = ranking.train
    assert len(examples) > 0 and examples.candidates.shape == (len(examples), 7)
    counts = negative_counts(config)
    popularity = np.bincount(np.concatenate(train), minlength=len(data.vocab) + 1)
    top, _ = retrieve(
        model, index, [train[u][:t] for u, t in zip(examples.users, examples.positions, strict=True)], 12
    )
    for row in range(len(examples)):
        u, t = int(examples.users[row]), int(examples.positions[row])
        s = train[u]
        assert max(1, len(s) - 4) <= t < len(s)
        # No leakage: the history is exactly the items before t (its last max_len).
        history = examples.history[row]
        np.testing.assert_array_equal(history[history != 0], s[:t][-6:])
        assert (history[: 6 - min(t, 6)] == 0).all()
        cands, labels = examples.candidates[row], examples.labels[row]
        assert labels.sum() == 1 and cands[labels == 1][0] == s[t]
        negs = cands[(labels == 0) & (cands != 0)]
        assert len(set(negs.tolist())) == len(negs)  # distinct
        assert not np.isin(negs, s).any()  # never the positive nor any item of the user
        real = cands != 0
        assert not (real[1:] & ~real[:-1]).any()  # padding only at the end
        retrieved = set(top[row][top[row] > 0].tolist())
        if positives_only:
            assert s[t] in retrieved
        if negatives == "retrieved":
            assert set(negs.tolist()) <= retrieved
        if negatives == "uniform":
            assert len(negs) == 6  # the catalogue (40 items) always has 6 left
        if "popularity" in negatives:
            sampled = negs[[n not in retrieved for n in negs]]
            assert (popularity[sampled] > 0).all()
            assert len(negs) >= counts["popularity"]


@pytest.mark.parametrize("negatives", ["retrieved", "uniform", "retrieved+popularity"])
def test_click_examples_carry_the_retrievers_score_of_every_candidate(setup, negatives: str) -> None:
    data, _, _ = setup
    model = fake_model(data, num_interests=2)  # the score is a max over the two interests
    index = build_index_from_model(model)
    config = RankerConfig(
        negatives=negatives, num_negatives=6, positions_per_user=3, candidates=12, context_size=4,
        retrieved_positives_only=False,
    )  # fmt: skip
    ranking = build_ranking_data(model, index, data, config)
    train = leave_one_out(data).train
    for examples, history_of in (
        (ranking.train, lambda u, t: train[u][:t]),
        (ranking.valid, lambda u, t: train[u]),
    ):
        histories = [history_of(u, t) for u, t in zip(examples.users, examples.positions, strict=True)]
        top, top_scores = retrieve(model, index, histories, 12)
        interests = model.encode(histories)  # [E, 2, d]
        vectors = model.item_embeddings[examples.candidates]  # [E, C, d]
        oracle = np.einsum("ekd,ecd->eck", interests, vectors).max(axis=2)  # numpy max over interests
        real = examples.candidates > 0
        np.testing.assert_allclose(examples.retrieval_scores[real], oracle[real], rtol=1e-5, atol=1e-5)
        assert np.all(examples.retrieval_scores[~real] == 0.0)
        searched = 0
        for row in range(len(examples)):
            for c, item in enumerate(examples.candidates[row]):
                hit = np.flatnonzero(top[row] == item)
                if item and len(hit):  # retrieved: exactly what the search returned for it
                    assert examples.retrieval_scores[row, c] == pytest.approx(
                        top_scores[row, hit[0]], abs=1e-5
                    )
                    searched += 1
        assert searched > 0
        # DSTN's context: the request's top context_size + 1 retrieved items, best first.
        np.testing.assert_array_equal(examples.context, np.where(top[:, :5] > 0, top[:, :5], 0))
    if negatives == "uniform":  # some candidates were not retrieved: their score was computed
        rows = enumerate(ranking.valid.candidates)
        assert any(n and n not in top[r] for r, row in rows for n in row)


def test_only_retrieved_clicks_are_kept_and_validation_uses_the_validation_target(setup) -> None:
    data, model, index = setup
    config = RankerConfig(num_negatives=5, positions_per_user=3, candidates=10, num_unclicked=4)
    ranking = build_ranking_data(model, index, data, config)
    split = leave_one_out(data)
    valid = ranking.valid
    assert 0 < len(valid) <= len(split.valid_users)
    histories = [split.train[u] for u in valid.users]
    top, _ = retrieve(model, index, histories, 10)
    for row, u in enumerate(valid.users.tolist()):
        target = split.valid_targets[list(split.valid_users).index(u)]
        assert valid.candidates[row][valid.labels[row] == 1][0] == target
        assert valid.positions[row] == len(split.train[u])
        assert target in top[row]
        # Unclicked = the previous request's (history one event shorter) top items but its click.
        previous, _ = retrieve(model, index, [split.train[u][:-1]], 10)
        shown = previous[0][(previous[0] > 0) & (previous[0] != split.train[u][-1])][:4]
        np.testing.assert_array_equal(valid.unclicked[row][valid.unclicked[row] != 0], shown)


def test_test_lists_are_the_retrievers_and_retrieval_only_matches_the_projects_evaluation(setup) -> None:
    data, model, index = setup
    ranking = build_ranking_data(model, index, data, RankerConfig(candidates=15, num_negatives=4))
    split = leave_one_out(data)
    lists = ranking.test
    assert len(lists.targets) == len(split.test_users)
    for row, history in enumerate(lists.histories):
        np.testing.assert_array_equal(history, split.test_histories[row])
        assert not np.isin(lists.candidates[row], history).any()  # history excluded
    expected = evaluate_ranking(model, list(lists.histories), lists.targets, ks=(10,), index=index)
    found = list_metrics(lists.candidates, lists.scores, lists.targets)
    assert found["ndcg@10"] == pytest.approx(expected["ndcg@10"])
    assert found["hr@10"] == pytest.approx(expected["hr@10"])


def test_evaluation_feeds_the_searchs_scores_to_the_rankers(setup) -> None:
    data, model, index = setup
    ranking = build_ranking_data(model, index, data, RankerConfig(candidates=15, num_negatives=4))
    lists = ranking.test
    seen = {}

    def echo(histories, candidates, unclicked, retrieval_scores):
        seen["scores"] = retrieval_scores
        return np.where(candidates > 0, -np.asarray(retrieval_scores), -np.inf)  # the reverse order

    found = evaluate_reranking(lists, {"echo": echo, "same": lambda h, c, u, s: s})
    np.testing.assert_array_equal(seen["scores"], lists.scores)
    assert found["rerankers"]["same"]["ndcg@10"] == found["retrieval"]["ndcg@10"]
    # The reverse of the retriever's order: every per-user AUC flips (no ties among the scores).
    assert found["rerankers"]["echo"]["gauc"] == pytest.approx(1 - found["retrieval"]["gauc"])


def test_overrides_and_bad_settings() -> None:
    config = apply_overrides(
        RankerConfig(),
        ["epochs=3", "attributes=false", "negatives=retrieved+uniform", "options.units=[4, 2]"],
    )
    assert (config.epochs, config.attributes, config.options) == (3, False, {"units": [4, 2]})
    assert negative_counts(dataclasses.replace(config, num_negatives=5)) == {"retrieved": 3, "uniform": 2}
    with pytest.raises(ValueError, match="unknown ranker setting"):
        apply_overrides(RankerConfig(), ["nope=1"])
    with pytest.raises(ValueError, match="negatives"):
        negative_counts(RankerConfig(negatives="retrieved+bogus"))
    config = apply_overrides(RankerConfig(), ["options.retrieval_score=false", "context_size=5"])
    assert config.options == {"retrieval_score": False} and config.context_size == 5
    with pytest.raises(ValueError, match="context_size=N, not options"):
        check_config(apply_overrides(RankerConfig(), ["options.context_size=5"]))


# --- AUC and GAUC -----------------------------------------------------------------------------


def brute_auc(scores: list[float], labels: list[int]) -> float:
    pairs = [(p, n) for p, n in product(range(len(scores)), repeat=2) if labels[p] and not labels[n]]
    wins = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs)
    return wins / len(pairs) if pairs else float("nan")


def test_auc_and_gauc_match_brute_force_with_ties_and_padding() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, (30, 9)).astype(np.float64)  # many ties
    labels = rng.random((30, 9)) < 0.25
    valid = rng.random((30, 9)) < 0.8
    labels[0], labels[1] = False, valid[1]  # a user without positives, one without negatives
    flat = scores[valid].tolist(), labels[valid].astype(int).tolist()
    assert auc(scores[valid], labels[valid]) == pytest.approx(brute_auc(*flat))
    expected = [
        brute_auc(scores[u][valid[u]].tolist(), labels[u][valid[u]].astype(int).tolist()) for u in range(30)
    ]
    np.testing.assert_allclose(per_user_auc(scores, labels, valid), expected, equal_nan=True)
    counted = [u for u in range(30) if not np.isnan(expected[u])]
    weights = [valid[u].sum() for u in counted]
    value, users = gauc(scores, labels, valid)
    assert users == len(counted) and 0 not in counted and 1 not in counted
    assert value == pytest.approx(
        sum(w * expected[u] for u, w in zip(counted, weights, strict=True)) / sum(weights)
    )
    assert np.isnan(auc(np.ones(3), np.zeros(3)))


def test_list_metrics_rerank_by_score_and_count_missing_targets_as_zero() -> None:
    candidates = np.array([[5, 6, 7, -1], [1, 2, 3, 4]])
    scores = np.array([[0.1, 0.9, 0.5, 0.0], [4.0, 3.0, 2.0, 1.0]])
    targets = np.array([7, 9])  # user 1's target was not retrieved
    out = list_metrics(candidates, scores, targets, ks=(2,))
    # User 0: order 6, 7, 5 -> target at rank 2: NDCG = 1/log2(3); user 1 counts 0.
    assert out["ndcg@2"] == pytest.approx((1 / np.log2(3)) / 2) and out["hr@2"] == 0.5
    assert out["gauc"] == pytest.approx(0.5) and out["gauc_users"] == 1  # 7 beats 5, loses to 6


# --- the ranker artifact ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_ranker():
    vocab = ItemVocab.from_ids([f"i{i}" for i in range(40)])
    attributes = cluster_attributes(vocab)
    keras.utils.set_random_seed(0)
    kwargs = {
        "num_items": 40,
        "dim": 8,
        "max_len": 6,
        "num_attributes": attributes.num_attributes,
        "ranker_scale_init": 0.5,  # the ranker's own part counts in these tests
        **TINY["din"],
    }
    ranker = build_ranker("din", **kwargs)
    ranker.build()
    return ranker, kwargs, vocab, attributes


def test_artifact_round_trip_scores_like_the_model_and_refuses_other_vocabularies(
    small_ranker, tmp_path
) -> None:
    ranker, kwargs, vocab, attributes = small_ranker
    out = tmp_path / "ranker"
    manifest = save_ranker(
        out, ranker, "din", kwargs, vocab, "model-v1", attributes, config={"ranker": "din"}
    )
    assert manifest["kind"] == "ranker" and manifest["model_version"] == "model-v1"
    loaded = load_ranker(out, vocab)
    rng = np.random.default_rng(0)
    histories = [rng.integers(1, 41, n) for n in (1, 4, 9)]
    candidates = rng.integers(1, 41, (3, 5))
    candidates[0, -1] = -1  # an empty retrieval slot
    scores = rng.normal(size=(3, 5)).astype(np.float32)
    scores[0, -1] = -np.inf
    got = loaded.score(histories, candidates, retrieval_scores=scores)
    # The in-memory model on the same inputs (attributes looked up in numpy).
    history = np.zeros((3, 6), np.int32)
    for row, h in zip(history, histories, strict=True):
        row[6 - min(len(h), 6) :] = h[-6:]
    cands = np.where(candidates > 0, candidates, 0).astype(np.int32)
    x = {
        "history": history,
        "candidates": cands,
        "history_attributes": attributes.table[history],
        "candidate_attributes": attributes.table[cands],
        "retrieval_scores": scores,
    }
    expected = np.asarray(ranker(x, training=False))
    np.testing.assert_allclose(got[candidates > 0], expected[candidates > 0], atol=1e-5)
    assert got[0, -1] == -np.inf

    other = ItemVocab.from_ids([f"i{i}" for i in range(39)] + ["new"])
    with pytest.raises(ArtifactError, match="another item vocabulary"):
        load_ranker(out, other)
    (out / "vocab.json").write_text((out / "vocab.json").read_text().replace('"i3"', '"i3x"'))
    with pytest.raises(ArtifactError, match="corrupted"):
        load_ranker(out, vocab)
    with pytest.raises(ArtifactError, match="not a ranker artifact"):
        load_ranker(tmp_path, vocab)


def test_the_scorer_feeds_the_retrieval_scores_and_an_old_artifact_still_loads(
    small_ranker, tmp_path
) -> None:
    ranker, kwargs, vocab, attributes = small_ranker
    assert ranker.retrieval_score  # the default
    before = float(ranker.ranker_scale)
    ranker.ranker_scale.assign(0.0)  # the ranker's untrained start: exactly the retriever's order
    save_ranker(tmp_path / "new", ranker, "din", kwargs, vocab, "model-v1", attributes)
    ranker.ranker_scale.assign(before)
    manifest = json.loads((tmp_path / "new" / "manifest.json").read_text())
    assert manifest["ranker_format"] == 2 and manifest["ranker_kwargs"]["retrieval_score"] is True
    loaded = load_ranker(tmp_path / "new", vocab)
    histories = [np.array([1, 2, 3]), np.array([7])]
    candidates = np.array([[4, 5, 6, -1], [8, 9, 10, 11]])
    scores = np.array([[0.5, 2.0, -1.0, -np.inf], [3.0, 1.0, 2.0, 0.0]], np.float32)
    got = loaded.score(histories, candidates, retrieval_scores=scores)
    np.testing.assert_allclose(got[candidates > 0], scores[candidates > 0], atol=1e-6)
    assert got[0, -1] == -np.inf and loaded.uses_scores
    with pytest.raises(ValueError, match="pass retrieval_scores"):
        loaded.score(histories, candidates)
    with pytest.raises(ValueError, match="finite"):
        loaded.score(histories, candidates, retrieval_scores=np.full((2, 4), np.nan, np.float32))

    # An artifact written before the option (no ranker_format, no retrieval_score in its kwargs,
    # weights without g, w, b) is rebuilt as it was trained and scores without retrieval scores.
    keras.utils.set_random_seed(3)
    old = build_ranker("din", **kwargs, retrieval_score=False)
    old.build()
    save_ranker(tmp_path / "old", old, "din", kwargs, vocab, "model-v1", attributes)
    path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["ranker_format"], manifest["ranker_kwargs"]["retrieval_score"]
    path.write_text(json.dumps(manifest))
    legacy = load_ranker(tmp_path / "old", vocab)
    assert not legacy.uses_scores
    plain = legacy.score(histories, candidates)
    np.testing.assert_array_equal(legacy.score(histories, candidates, retrieval_scores=scores), plain)
    x = {"history": pad_left(histories, 6), "candidates": np.where(candidates > 0, candidates, 0)}
    x = {**x, "history_attributes": attributes.table[x["history"]]}
    x["candidate_attributes"] = attributes.table[x["candidates"]]
    np.testing.assert_allclose(plain[candidates > 0], np.asarray(old(x))[candidates > 0], atol=1e-5)
    manifest["ranker_format"] = 7
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="ranker_format 7"):
        load_ranker(tmp_path / "old", vocab)


def test_dstn_context_has_the_same_size_in_training_and_evaluation(setup) -> None:
    data, model, index = setup
    config = RankerConfig(ranker="dstn", num_negatives=5, candidates=20, context_size=4, max_len=6)
    ranking = build_ranking_data(model, index, data, config)
    keras.utils.set_random_seed(0)
    dstn = build_ranker(
        "dstn", **ranker_kwargs(config, len(data.vocab), None, model.dim), attention_units=4, hidden_units=[8]
    )
    dstn.build()
    assert dstn.context_size == 4 and ranking.train.context.shape[1] == 5

    def context_counts(x: dict[str, np.ndarray]) -> np.ndarray:
        alpha = np.asarray(dstn.attention(x)["context"])  # [B, C, N + 1]
        return (alpha > 0).sum(-1)[x["candidates"] > 0]

    train = ranking.train.inputs(unclicked=True, context=True)
    assert np.all(context_counts(train) == 4)  # 6 candidates per click
    # Evaluation: the scorer builds the context from the 20 candidates being reranked.
    scorer = RankerScorer(dstn, None, uses_unclicked=True)
    lists = ranking.test
    cands = np.where(lists.candidates > 0, lists.candidates, 0)
    seen: dict[str, np.ndarray] = {}
    original = scorer.concrete  # what the scorer calls, on the inputs it built

    def spy(inputs: dict[str, np.ndarray]):
        seen.update(inputs)
        return original(inputs)

    scorer.concrete = spy  # type: ignore[assignment]
    scorer.score(lists.histories, cands, lists.unclicked, lists.scores)
    assert seen["context"].shape == (len(cands), 5) and seen["candidates"].shape[1] == 20
    np.testing.assert_array_equal(seen["context"], cands[:, :5])  # the head of the retrieved list
    assert np.all(context_counts(seen) == 4)


def test_scorer_traces_once_and_is_thread_safe(small_ranker) -> None:
    ranker, _, _, attributes = small_ranker
    scorer = RankerScorer(ranker, attributes, uses_unclicked=False)
    rng = np.random.default_rng(1)
    requests = [
        (
            [rng.integers(1, 41, rng.integers(1, 12)) for _ in range(b)],
            rng.integers(1, 41, (b, c)),
            rng.normal(size=(b, c)).astype(np.float32),
        )
        for b, c in [(1, 3), (7, 20), (2, 1), (5, 9)]
    ]
    expected = [scorer.score(h, c, retrieval_scores=s) for h, c, s in requests]
    results: dict[int, list[np.ndarray]] = {}

    def work(worker: int) -> None:
        results[worker] = [scorer.score(h, c, retrieval_scores=s) for h, c, s in requests * 3]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for found in results.values():
        for got, want in zip(found, expected * 3, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)
    assert scorer.tracing_count() == 1
    with pytest.raises(ValueError, match="beyond the 40 items"):
        scorer.score([np.array([1])], np.array([[41]]), retrieval_scores=np.zeros((1, 1)))


# --- training ---------------------------------------------------------------------------------


def test_train_ranker_learns_better_than_random(setup) -> None:
    data, model, index = setup
    config = RankerConfig(
        ranker="din", dim=8, item_init="random", max_len=6, options=TINY["din"], negatives="uniform",
        num_negatives=8, retrieved_positives_only=False, positions_per_user=12, candidates=20, epochs=12,
        batch_size=32, learning_rate=0.01, patience=3, seed=5,
    )  # fmt: skip
    ranking = build_ranking_data(model, index, data, config)
    ranking = dataclasses.replace(ranking, attributes=cluster_attributes(data.vocab))
    trained = train_ranker(config, ranking, verbose=0)
    history = trained.metrics.validation_per_epoch
    print([round(h["val_auc"], 3) for h in history], trained.metrics.reranked)
    assert trained.metrics.validation["val_auc"] > 0.75  # random scores give 0.5
    assert trained.metrics.validation["val_auc"] > history[0]["val_auc"]
    assert trained.kwargs["num_attributes"] == 4
    assert trained.metrics.reranked["auc"] > 0.6


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_item_table_starts_from_the_retrievers_embeddings(setup) -> None:
    data, model, index = setup
    config = RankerConfig(
        ranker="afm", epochs=1, learning_rate=1e-9, num_negatives=4, candidates=10, retrieval_fit="joint"
    )
    ranking = build_ranking_data(model, index, data, config)
    trained = train_ranker(config, ranking, verbose=0)
    assert trained.kwargs["dim"] == model.dim  # dim 0 = the retriever's
    table = np.asarray(trained.model.item_tower.embedding.embeddings)
    np.testing.assert_allclose(table, model.item_embeddings, atol=1e-4)
    # Joint training starts from g = 0 and the training clicks' logistic fit on the score (w > 0).
    train = ranking.train
    _, w, b = fit_blend(
        0 * train.retrieval_scores, train.retrieval_scores, train.labels > 0, train.candidates > 0
    )
    term = trained.metrics.retrieval_term
    assert w > 0 and abs(term["ranker_scale"]) < 1e-6
    assert (term["retrieval_weight"], term["retrieval_bias"]) == pytest.approx((w, b), abs=1e-5)
    # Epoch 0 (validated before training, a candidate for the kept weights) is the retriever's order.
    first = trained.metrics.validation_per_epoch[0]
    valid = ranking.valid
    expected, _ = gauc(valid.retrieval_scores, valid.labels > 0, valid.candidates > 0)
    assert first["epoch"] == 0 and first["val_gauc"] == pytest.approx(expected)
    assert trained.metrics.epochs_trained == 1
    # Barely trained, the ranker (g ≈ 0, w > 0) reranks exactly as the retriever ordered.
    for metric in ("ndcg@10", "hr@10", "gauc"):
        assert trained.metrics.reranked[metric] == pytest.approx(trained.metrics.retrieval[metric])
    with pytest.raises(ValueError, match="dim must be 8"):
        train_ranker(dataclasses.replace(config, dim=16), ranking, verbose=0)


def test_fit_blend_recovers_a_known_logistic_model() -> None:
    rng = np.random.default_rng(4)
    own, scores = rng.normal(size=(4000, 10)), rng.normal(2.0, 3.0, size=(4000, 10))
    valid = rng.random((4000, 10)) < 0.9
    labels = rng.random((4000, 10)) < 1 / (1 + np.exp(-(1.5 * own - 0.5 * scores + 0.25)))
    g, w, b = fit_blend(own, scores, labels, valid)
    np.testing.assert_allclose([g, w, b], [1.5, -0.5, 0.25], atol=0.08)
    # Invalid slots do not count: a wild value there changes nothing.
    own[~valid] = 1e6
    assert fit_blend(own, scores, labels, valid) == pytest.approx((g, w, b))


def test_fit_list_blend_recovers_a_known_softmax_choice_model() -> None:
    rng = np.random.default_rng(5)
    own, scores = rng.normal(size=(3000, 12)), rng.normal(1.0, 2.0, size=(3000, 12))
    present = np.ones((3000, 12), bool)
    present[:, -3:] = rng.random((3000, 3)) < 0.5  # shorter lists
    z = np.where(present, 1.2 * own + 0.4 * scores, -np.inf)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    choice = np.array([rng.choice(12, p=row) for row in p])
    targets = np.zeros((3000, 12), bool)
    targets[np.arange(3000), choice] = True
    targets[:100] = False  # lists without their target do not count
    g, w = fit_list_blend(own, scores, targets, present)
    np.testing.assert_allclose([g, w], [1.2, 0.4], atol=0.08)
    # The loss by hand for one list: logsumexp over its candidates minus the target's logit.
    logits = np.array([[1.0, 2.0, 0.5, 9.0]])
    one = np.array([[False, True, False, False]])
    first_three = np.array([[True, True, True, False]])
    assert list_loss(logits, one, first_three) == pytest.approx(np.log(np.exp([1.0, 2.0, 0.5]).sum()) - 2.0)
    assert fit_bias(np.zeros(4), np.array([1, 0, 0, 0]), np.ones(4, bool)) == pytest.approx(np.log(1 / 3))


def assert_exported_blend(metrics: RankerMetrics, best: dict) -> None:
    """The exported ``g, w, b`` (``metrics.json``) are the best epoch's fitted blend."""
    term = metrics.retrieval_term
    assert term is not None
    assert [term["ranker_scale"], term["retrieval_weight"], term["retrieval_bias"]] == pytest.approx(
        best["blend"], abs=1e-4
    )


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_retrieval_fit_on_lists_fits_the_blend_on_the_validation_users_whole_lists(setup) -> None:
    data, model, index = setup
    config = RankerConfig(
        ranker="din", max_len=6, options=TINY["din"], num_negatives=5, candidates=15, epochs=2, patience=0
    )
    assert config.retrieval_fit == "lists"  # the default
    ranking = build_ranking_data(model, index, data, config)
    lists = ranking.valid_lists
    assert lists is not None and len(lists.targets) == len(ranking.valid)
    np.testing.assert_array_equal(lists.targets, ranking.valid.candidates[ranking.valid.labels > 0])
    trained = train_ranker(config, ranking, verbose=0)
    history = trained.metrics.validation_per_epoch
    best = min(history, key=lambda h: h["val_list_loss"])
    assert trained.metrics.best_epoch == best["epoch"]
    assert_exported_blend(trained.metrics, best)
    # Refit from the final model's own logits on the validation lists: the same g and w.
    ranker = trained.model
    ranker.set_blend(1.0, 0.0, 0.0)  # the ranker's own logits alone
    present = lists.candidates > 0
    own = RankerScorer(ranker, None, False).score(
        lists.histories, np.where(present, lists.candidates, 0), None, lists.scores
    )
    targets = present & (lists.candidates == lists.targets[:, None])
    np.testing.assert_allclose(
        fit_list_blend(own, lists.scores, targets, present), best["blend"][:2], atol=1e-3
    )


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_retrieval_fit_on_clicks_trains_the_ranker_alone_then_fits_the_blend(setup) -> None:
    data, model, index = setup
    config = RankerConfig(
        ranker="din", max_len=6, options=TINY["din"], num_negatives=5, candidates=15, epochs=2,
        retrieval_fit="clicks", patience=0,
    )  # fmt: skip
    ranking = build_ranking_data(model, index, data, config)
    trained = train_ranker(config, ranking, verbose=0)
    history = trained.metrics.validation_per_epoch
    best = next(h for h in history if h["epoch"] == trained.metrics.best_epoch)
    assert_exported_blend(trained.metrics, best)
    # The blend was fitted on the ranker's own logits: refit it from the final model's.
    ranker = trained.model
    ranker.set_blend(1.0, 0.0, 0.0)  # the ranker's own logits alone
    valid = ranking.valid
    own = np.asarray(ranker(valid.inputs(unclicked=False)))  # the fake model has no attributes
    refit = fit_blend(own, valid.retrieval_scores, valid.labels > 0, valid.candidates > 0)
    np.testing.assert_allclose(refit, best["blend"], atol=1e-3)
    with pytest.raises(ValueError, match="retrieval_fit"):
        check_config(dataclasses.replace(config, retrieval_fit="test"))


# --- the CLI ----------------------------------------------------------------------------------


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_cli_trains_evaluates_and_writes_a_loadable_artifact(
    synthetic_csv: Path, model_versions: list[tuple[Path, Path, str]], tmp_path: Path, capsys
) -> None:
    model_dir, index_dir, _ = model_versions[0]  # the session's retriever: what is checked holds for any
    out = tmp_path / "dstn"
    code = run_tool(
        "train_ranker",
        "--model", str(model_dir), "--index", str(index_dir), "--data", str(synthetic_csv),
        "--ranker", "dstn", "--out", str(out), "--epochs", "2", "--candidates", "15", "--num-negatives", "5",
        "--dim", "8", "--set", "options.hidden_units=[8]", "--set", "options.attention_units=4", "--quiet",
    )  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert printed["reranked"] == metrics["reranked"]
    for row in ("retrieval", "reranked"):
        assert set(metrics[row]) >= {"ndcg@10", "hr@10", "auc", "gauc", "gauc_users"}
    # Retrieval only = the project's evaluation through the index (same users, same lists).
    model = load_model(model_dir)
    index, _ = load_index(index_dir)
    expected = evaluate_protocol(model, synthetic_csv, "loo", index=index).metrics
    assert metrics["retrieval"]["ndcg@10"] == pytest.approx(expected["ndcg@10"])
    assert metrics["retrieval"]["hr@10"] == pytest.approx(expected["hr@10"])

    loaded = load_ranker(out, model)
    assert loaded.name == "dstn" and loaded.model_version == model.version
    scores = loaded.score(
        [np.array([1, 2, 3])], np.array([[4, 5, 6, 0]]), [np.array([7, 8])], np.array([[3.0, 2.0, 1.0, 0.0]])
    )
    assert np.isfinite(scores[0, :3]).all() and scores[0, 3] == -np.inf
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["uses_unclicked"] and manifest["ranker_kwargs"]["num_items"] == len(model.vocab)
    assert manifest["ranker_kwargs"]["retrieval_score"] and manifest["ranker_kwargs"]["context_size"] == 20
    # The artifact's config.json given back as --config: the configuration it was trained with.
    assert run_tool("train_ranker", "--print-config", "--config", str(out / "config.json")) == 0
    assert capsys.readouterr().out.strip() == (out / "config.json").read_text().strip()
    assert run_tool("train_ranker", "--model", str(model_dir), "--index", str(index_dir), "--data",
                    str(synthetic_csv), "--ranker", "din", "--out", str(out)) == 2  # fmt: skip
