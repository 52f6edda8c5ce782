"""The training task against numpy re-implementations."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from retrieval.training.losses.interests import label_aware_attention, select_interest
from retrieval.training.losses.logits import (
    GeneralisedBCE,
    SoftmaxCrossEntropy,
    candidate_logits,
    sampled_softmax_loss,
)
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import LOSSES, RetrievalTask, SampledSoftmaxTask, build_task
from tests.helpers import compile_for_fit, tiered


def numpy_sampled_softmax(q, pos, pos_ids, neg, neg_ids, pos_logq, neg_logq, temperature, remove_hits):
    losses = []
    for b in range(len(q)):
        logits = [q[b] @ pos[b] / temperature - pos_logq[b]]
        for j in range(len(neg)):
            if remove_hits and neg_ids[j] == pos_ids[b]:
                continue  # an accidental hit leaves this row's softmax
            logits.append(q[b] @ neg[j] / temperature - neg_logq[j])
        logits = np.array(logits, np.float64)
        losses.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[0])
    return np.array(losses)


@pytest.mark.parametrize("remove_hits", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_softmax_matches_numpy(remove_hits: bool, temperature: float) -> None:
    rng = np.random.default_rng(0)
    q, pos = rng.normal(size=(5, 16)), rng.normal(size=(5, 16))
    pos_ids = np.array([3, 7, 7, 1, 9])
    neg_ids = np.array([7, 2, 3, 3, 8, 5])  # ids 7 and 3 collide with positives
    neg = rng.normal(size=(6, 16))
    pos_logq, neg_logq = np.log(rng.uniform(0.01, 0.2, 5)), np.log(rng.uniform(0.01, 0.2, 6))
    got = sampled_softmax_loss(
        *(tf.constant(a, tf.float32) for a in (q, pos)),
        tf.constant(pos_ids),
        tf.constant(neg, tf.float32),
        tf.constant(neg_ids),
        tf.constant(pos_logq, tf.float32),
        tf.constant(neg_logq, tf.float32),
        temperature,
        remove_hits,
    )
    expected = numpy_sampled_softmax(
        q, pos, pos_ids, neg, neg_ids, pos_logq, neg_logq, temperature, remove_hits
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4)


def test_select_interest_takes_the_argmax_interest() -> None:
    rng = np.random.default_rng(1)
    interests, target = rng.normal(size=(6, 4, 8)), rng.normal(size=(6, 8))
    got = select_interest(tf.constant(interests, tf.float32), tf.constant(target, tf.float32)).numpy()
    best = np.einsum("bkd,bd->bk", interests, target).argmax(axis=1)
    np.testing.assert_allclose(got, interests[np.arange(6), best], rtol=1e-6)


def test_select_interest_sends_gradient_only_to_the_chosen_interest() -> None:
    interests = tf.Variable([[[1.0, 0.0], [0.0, 1.0]]])
    target = tf.constant([[0.0, 2.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(select_interest(interests, target))
    grad = tape.gradient(loss, interests).numpy()
    np.testing.assert_array_equal(grad, [[[0.0, 0.0], [1.0, 1.0]]])


def test_sampler_follows_its_distribution_and_never_draws_padding() -> None:
    tf.random.set_seed(0)
    counts = np.array([0, 100, 10, 1, 0])
    sampler = CandidateSampler.from_counts(counts, "popularity", alpha=1.0)
    q = np.array([0, 101, 11, 2, 1]) / 115
    np.testing.assert_allclose(np.exp(sampler.log_q.numpy()[1:]), q[1:], rtol=1e-5)
    draws = sampler.sample(200_000).numpy()
    assert draws.min() >= 1 and draws.max() <= 4
    freq = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(freq[1:], q[1:], atol=0.004)


def test_uniform_sampler_and_bad_arguments() -> None:
    sampler = CandidateSampler.from_counts(np.array([0, 5, 0, 9]), "uniform")
    np.testing.assert_allclose(np.exp(sampler.log_q.numpy()[1:]), 1 / 3, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown sampler"):
        CandidateSampler.from_counts(np.ones(3), "zipf")
    with pytest.raises(ValueError, match="0 for padding"):
        CandidateSampler(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="num_negatives"):
        SampledSoftmaxTask(sampler, 0)


def test_task_reduces_to_the_reference_with_fixed_negatives() -> None:
    """The task picks the best interest, embeds, samples and applies the loss: check the wiring."""
    rng = np.random.default_rng(2)
    table = tf.constant(rng.normal(size=(6, 4)), tf.float32)
    sampler = CandidateSampler.from_counts(np.array([0, 1, 1, 1, 1, 1]), "uniform")
    task = SampledSoftmaxTask(sampler, num_negatives=3)
    fixed = tf.constant([1, 2, 5])
    task.sampler.sample = lambda n: fixed  # type: ignore[method-assign]
    interests = rng.normal(size=(2, 3, 4)).astype(np.float32)
    targets = np.array([2, 4])
    got = task(tf.constant(interests), tf.constant(targets), lambda ids: tf.gather(table, ids)).numpy()
    t = table.numpy()
    q = np.stack([interests[b, np.argmax(interests[b] @ t[targets[b]])] for b in range(2)])
    logq = np.log(np.full(3, 0.2))
    expected = numpy_sampled_softmax(
        q, t[targets], targets, t[[1, 2, 5]], [1, 2, 5], logq[:2], logq, 1.0, True
    )
    assert got == pytest.approx(expected.mean(), rel=1e-5)


def test_positional_targets_average_over_real_positions_only() -> None:
    """Per-position outputs [B, L, d] with targets [B, L] (0 = none): one softmax per real target."""
    rng = np.random.default_rng(3)
    table = tf.constant(rng.normal(size=(6, 4)), tf.float32)
    sampler = CandidateSampler.from_counts(np.array([0, 1, 1, 1, 1, 1]), "uniform")
    task = SampledSoftmaxTask(sampler, num_negatives=2)
    task.sampler.sample = lambda n: tf.constant([3, 5])  # type: ignore[method-assign]
    outputs = rng.normal(size=(2, 3, 4)).astype(np.float32)
    targets = np.array([[0, 2, 4], [0, 0, 1]])
    got = task(tf.constant(outputs), tf.constant(targets), lambda ids: tf.gather(table, ids)).numpy()
    t = table.numpy()
    rows, cols = np.nonzero(targets)
    q, ids = outputs[rows, cols], targets[rows, cols]
    logq = np.log(np.full(2, 0.2))
    expected = numpy_sampled_softmax(
        q, t[ids], ids, t[[3, 5]], [3, 5], np.log(np.full(3, 0.2)), logq, 1.0, True
    )
    assert got == pytest.approx(expected.mean(), rel=1e-5)


def numpy_label_aware(interests: np.ndarray, target: np.ndarray, power: float) -> np.ndarray:
    """softmax over the non-zero interests of sign(x)|x|^p (x^0 = 1), then the weighted sum."""
    out = []
    for v, e in zip(interests, target, strict=True):
        real = np.abs(v).sum(-1) > 0
        x = v[real] @ e
        logits = np.ones_like(x) if power == 0 else np.sign(x) * np.abs(x) ** power
        w = np.exp(logits - logits.max())
        out.append((w / w.sum()) @ v[real])
    return np.array(out)


def interests_with_a_masked_one(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    interests, target = rng.normal(size=(5, 4, 8)), rng.normal(size=(5, 8))
    interests[1, 3] = 0.0  # masked interests, as dynamic-K towers return them
    interests[2, 1:] = 0.0
    return interests.astype(np.float32), target.astype(np.float32)


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0, 2.0, 3.0])
def test_label_aware_attention_matches_numpy(power: float) -> None:
    interests, target = interests_with_a_masked_one(4)
    got = label_aware_attention(tf.constant(interests), tf.constant(target), power).numpy()
    np.testing.assert_allclose(got, numpy_label_aware(interests, target, power), rtol=1e-5, atol=1e-6)


def test_label_aware_attention_limits_and_masked_interests() -> None:
    interests, target = interests_with_a_masked_one(5)
    # p = 0: the plain mean of the unmasked interests.
    mean = label_aware_attention(tf.constant(interests), tf.constant(target), 0.0).numpy()
    np.testing.assert_allclose(mean[1], interests[1, :3].mean(0), rtol=1e-5)
    np.testing.assert_allclose(mean[2], interests[2, 0], rtol=1e-5)
    np.testing.assert_allclose(mean[0], interests[0].mean(0), rtol=1e-5)
    # Large p: the hard selection, once inner products are above 1 (x^p separates them).
    big = tf.constant(interests * 3.0)
    hard = select_interest(big, tf.constant(target)).numpy()
    soft = label_aware_attention(big, tf.constant(target), 20.0).numpy()
    np.testing.assert_allclose(soft, hard, rtol=1e-3, atol=1e-3)
    # A masked interest gets no weight even when every real interest scores below it (< 0).
    v = tf.constant([[[1.0, 0.0], [0.0, 0.0]]])
    e = tf.constant([[-2.0, 0.0]])
    np.testing.assert_allclose(label_aware_attention(v, e, 1.0).numpy(), [[1.0, 0.0]])
    np.testing.assert_allclose(select_interest(v, e).numpy(), [[1.0, 0.0]])
    with pytest.raises(ValueError, match=">= 0"):
        label_aware_attention(v, e, -1.0)


def test_label_aware_attention_sends_gradient_to_every_real_interest() -> None:
    interests = tf.Variable([[[1.0, 0.5], [0.2, 1.0], [0.0, 0.0]]])
    target = tf.constant([[0.3, 0.7]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(label_aware_attention(interests, target, 2.0))
    grad = tape.gradient(loss, interests).numpy()
    assert np.all(np.abs(grad[0, :2]).sum(-1) > 0) and np.isfinite(grad).all()


def test_task_takes_the_interest_selection_by_name() -> None:
    rng = np.random.default_rng(6)
    table = tf.constant(rng.normal(size=(6, 4)), tf.float32)
    sampler = CandidateSampler.from_counts(np.array([0, 1, 1, 1, 1, 1]), "uniform")
    interests = tf.constant(rng.normal(size=(2, 3, 4)), tf.float32)
    targets = tf.constant([2, 4])

    def loss(task: SampledSoftmaxTask) -> float:
        task.sampler.sample = lambda n: tf.constant([1, 3, 5])  # type: ignore[method-assign]
        return float(task(interests, targets, lambda ids: tf.gather(table, ids)))

    hard = loss(SampledSoftmaxTask(sampler, 3))
    soft = loss(SampledSoftmaxTask(sampler, 3, interest_selection="label_aware", label_aware_power=1.0))
    assert hard != pytest.approx(soft, rel=1e-3)
    query = label_aware_attention(interests, tf.gather(table, targets), 1.0).numpy()
    t = table.numpy()
    logq = np.log(np.full(3, 0.2))
    expected = numpy_sampled_softmax(
        query, t[[2, 4]], [2, 4], t[[1, 3, 5]], [1, 3, 5], logq[:2], logq, 1.0, True
    )
    assert soft == pytest.approx(expected.mean(), rel=1e-5)
    with pytest.raises(ValueError, match="unknown interest selection"):
        SampledSoftmaxTask(sampler, 3, interest_selection="softmax")
    with pytest.raises(ValueError, match="label_aware_power"):
        SampledSoftmaxTask(sampler, 3, interest_selection="label_aware", label_aware_power=-2.0)


def test_training_builds_the_task_with_the_configured_selection(synthetic_csv, tmp_path, monkeypatch) -> None:
    import retrieval.training.run
    from retrieval.config import apply_overrides
    from retrieval.training.config import Config

    built: list = []

    class Built(Exception):
        """Ends the run once its task is built: the fit after it is not under test."""

    def recording(*args, **kwargs):
        built.append(build_task(*args, **kwargs))
        raise Built

    monkeypatch.setattr(retrieval.training.run, "build_task", recording)
    overrides = [f"data.path={synthetic_csv}", "model.tower=mind", "model.dim=8", "model.max_len=6"]
    overrides += ["train.epochs=1", "train.num_negatives=5", "train.interest_selection=label_aware"]
    config = apply_overrides(Config(), [*overrides, "train.label_aware_power=3", "train.loss=mixed"])
    with pytest.raises(Built):
        retrieval.training.run.train(config, tmp_path / "model", verbose=0)
    (task,) = built
    assert (task.interest_selection, task.label_aware_power) == ("label_aware", 3.0)
    assert [type(n).__name__ for n in task.negatives] == ["InBatchNegatives", "SampledNegatives"]


# --------------------------------------------------------------------------- every loss vs numpy


def numpy_rows(q, pos, pos_ids, cand, cand_ids, pos_logq, cand_logq, temperature, remove_hits):
    """Per row: the corrected positive logit and the kept negative logits (shared or per-row candidates)."""
    cand, cand_ids, cand_logq = np.asarray(cand), np.asarray(cand_ids), np.asarray(cand_logq)
    rows = []
    for b in range(len(q)):
        ids = cand_ids if cand_ids.ndim == 1 else cand_ids[b]
        emb = cand if cand.ndim == 2 else cand[b]
        logq = cand_logq if cand_logq.ndim == 1 else cand_logq[b]
        negs = [
            q[b] @ emb[j] / temperature - logq[j]
            for j in range(len(ids))
            if not (remove_hits and ids[j] == pos_ids[b])
        ]
        rows.append((q[b] @ pos[b] / temperature - pos_logq[b], np.array(negs, np.float64)))
    return rows


def numpy_softmax_ce(rows) -> np.ndarray:
    out = []
    for p, negs in rows:
        logits = np.concatenate([[p], negs])
        out.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - p)
    return np.array(out)


def numpy_gbce(rows, beta: float) -> np.ndarray:
    """gSASRec's -(β log σ(s+) + Σ log(1 - σ(s-))) / (1 + n), written with sigmoids."""
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
    return np.array([-(beta * np.log(sig(p)) + np.log(1.0 - sig(n)).sum()) / (1 + len(n)) for p, n in rows])


def as_tf(*arrays, dtype=tf.float32):
    return [tf.constant(a, dtype) for a in arrays]


@pytest.mark.parametrize("remove_hits", [True, False])
def test_per_positive_candidates_match_numpy(remove_hits: bool) -> None:
    rng = np.random.default_rng(10)
    q, pos = rng.normal(size=(4, 8)), rng.normal(size=(4, 8))
    pos_ids = np.array([3, 7, 2, 5])
    cand_ids = np.array([[3, 1, 4], [6, 7, 7], [1, 2, 9], [8, 6, 1]])  # hits in rows 0, 1, 2
    cand = rng.normal(size=(4, 3, 8))
    pos_logq, cand_logq = np.log(rng.uniform(0.01, 0.2, 4)), np.log(rng.uniform(0.01, 0.2, (4, 3)))
    logits = candidate_logits(
        *as_tf(q, pos),
        tf.constant(pos_ids),
        tf.constant(cand, tf.float32),
        tf.constant(cand_ids),
        *as_tf(pos_logq, cand_logq),
        0.7,
        remove_hits,
    )
    rows = numpy_rows(q, pos, pos_ids, cand, cand_ids, pos_logq, cand_logq, 0.7, remove_hits)
    np.testing.assert_allclose(SoftmaxCrossEntropy()(*logits).numpy(), numpy_softmax_ce(rows), rtol=1e-4)
    np.testing.assert_allclose(GeneralisedBCE(0.3)(*logits).numpy(), numpy_gbce(rows, 0.3), rtol=1e-4)
    expected_valid = cand_ids != pos_ids[:, None] if remove_hits else np.ones((4, 3), bool)
    np.testing.assert_array_equal(logits[2].numpy(), expected_valid)


@pytest.mark.parametrize("beta", [1.0, 0.25])
@pytest.mark.parametrize("remove_hits", [True, False])
def test_gbce_matches_numpy_with_shared_negatives(beta: float, remove_hits: bool) -> None:
    rng = np.random.default_rng(11)
    q, pos = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    pos_ids, neg_ids = np.array([3, 7, 7, 1, 9]), np.array([7, 2, 3, 3, 8, 5])
    neg = rng.normal(size=(6, 8))
    logits = candidate_logits(
        *as_tf(q, pos), tf.constant(pos_ids), tf.constant(neg, tf.float32), tf.constant(neg_ids),
        remove_accidental_hits=remove_hits,
    )  # fmt: skip
    rows = numpy_rows(q, pos, pos_ids, neg, neg_ids, np.zeros(5), np.zeros(6), 1.0, remove_hits)
    np.testing.assert_allclose(GeneralisedBCE(beta)(*logits).numpy(), numpy_gbce(rows, beta), rtol=1e-5)


def test_gbce_beta_follows_the_paper() -> None:
    # 101 items, 10 negatives per positive: alpha = 10 / 100 = 0.1; beta = 1 - t (1 - alpha).
    assert GeneralisedBCE.beta_for(0.0, 10, 101) == pytest.approx(1.0)  # plain BCE
    assert GeneralisedBCE.beta_for(1.0, 10, 101) == pytest.approx(0.1)  # beta = alpha
    assert GeneralisedBCE.beta_for(0.75, 10, 101) == pytest.approx(0.325)
    # The README formula beta = alpha (t (1 - 1/alpha) + 1/alpha), computed literally.
    alpha, t = 0.1, 0.75
    assert GeneralisedBCE.beta_for(t, 10, 101) == pytest.approx(alpha * (t * (1 - 1 / alpha) + 1 / alpha))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        GeneralisedBCE.beta_for(1.5, 10, 101)


def tiny_catalogue(seed: int, num_embeddings: int = 8, dim: int = 4):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(num_embeddings, dim)).astype(np.float32)
    return rng, table, (lambda ids: tf.gather(tf.constant(table), ids))


def task_for(loss: str, counts: np.ndarray, targets: np.ndarray, **kwargs):
    sampler = CandidateSampler.from_counts(
        counts, kwargs.pop("sampler", "uniform"), seed=kwargs.pop("seed", 0)
    )
    p = np.bincount(targets[targets > 0].ravel(), minlength=len(counts)).astype(float)
    return build_task(
        loss,
        sampler=sampler,
        num_negatives=kwargs.pop("num_negatives", 3),
        target_probabilities=p / p.sum(),
        **kwargs,
    )


def fix_negatives(task, ids) -> None:
    for source in task.negatives:
        if hasattr(source, "sampler"):
            source.sampler.sample = lambda n: tf.reshape(tf.constant(ids, tf.int32), [-1])


def test_full_softmax_is_cross_entropy_over_the_catalogue_with_interest_selection() -> None:
    rng, table, embed = tiny_catalogue(12)
    interests = rng.normal(size=(3, 2, 4)).astype(np.float32)  # K = 2: the hard selection applies
    targets = np.array([2, 5, 2])
    task = task_for("full_softmax", np.ones(8), targets, temperature=0.5)
    got = float(task(tf.constant(interests), tf.constant(targets), embed))
    expected = []
    for b, t in enumerate(targets):
        q = interests[b, np.argmax(interests[b] @ table[t])]
        logits = table[1:] @ q / 0.5  # every item but padding
        expected.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[t - 1])
    assert got == pytest.approx(np.mean(expected), rel=1e-5)


@pytest.mark.parametrize("remove_hits", [True, False])
def test_in_batch_softmax_matches_numpy_with_log_q(remove_hits: bool) -> None:
    rng, table, embed = tiny_catalogue(13)
    queries = rng.normal(size=(4, 1, 4)).astype(np.float32)
    targets = np.array([2, 4, 2, 5])  # rows 0 and 2 share a target: accidental hits
    task = task_for("in_batch", np.ones(8), targets, remove_accidental_hits=remove_hits, temperature=0.8)
    got = float(task(tf.constant(queries), tf.constant(targets), embed))
    p = np.bincount(targets, minlength=8) / 4
    log_count = np.log(4 * p[targets])  # each candidate is one of the 4 targets, E[count] = 4 p
    rows = numpy_rows(
        queries[:, 0],
        table[targets],
        targets,
        table[targets],
        targets,
        log_count,
        log_count,
        0.8,
        remove_hits,
    )
    assert got == pytest.approx(numpy_softmax_ce(rows).mean(), rel=1e-5)
    if remove_hits:  # row 0 keeps only candidates 4 and 5; row 1 all but its own
        assert [len(n) for _, n in rows] == [2, 3, 2, 3]


def test_mixed_negatives_are_corrected_by_the_mixture() -> None:
    rng, table, embed = tiny_catalogue(14)
    queries = rng.normal(size=(3, 1, 4)).astype(np.float32)
    targets = np.array([1, 3, 3])
    counts = np.array([0, 9, 3, 1, 1, 1, 1, 1])
    task = task_for("mixed", counts, targets, sampler="popularity", num_negatives=3)
    sampled = np.array([3, 6, 1])
    fix_negatives(task, sampled)
    got = float(task(tf.constant(queries), tf.constant(targets), embed))
    q_sampler = (counts + 1.0) ** 0.75
    q_sampler[0] = 0
    q_sampler /= q_sampler.sum()
    p = np.bincount(targets, minlength=8) / 3

    def log_count(ids):
        return np.log(3 * p[ids] + 3 * q_sampler[ids])  # in-batch: 3 targets; sampled: 3 draws

    cand = np.concatenate([targets, sampled])
    rows = numpy_rows(
        queries[:, 0],
        table[targets],
        targets,
        table[cand],
        cand,
        log_count(targets),
        log_count(cand),
        1.0,
        True,
    )
    assert got == pytest.approx(numpy_softmax_ce(rows).mean(), rel=1e-5)


@pytest.mark.parametrize("loss, beta", [("bce", 1.0), ("gbce", None)])
def test_bce_tasks_match_numpy_without_log_q(loss: str, beta: float | None) -> None:
    rng, table, embed = tiny_catalogue(15)
    queries = rng.normal(size=(3, 1, 4)).astype(np.float32)
    targets = np.array([1, 3, 6])
    counts = np.array([0, 9, 3, 1, 1, 1, 1, 1])  # a skewed sampler: BCE logits are still not corrected
    task = task_for(loss, counts, targets, sampler="popularity", gbce_t=0.5, temperature=0.5, num_negatives=4)
    fix_negatives(task, [3, 2, 1, 7])
    got = float(task(tf.constant(queries), tf.constant(targets), embed))
    beta = beta if beta is not None else 1 - 0.5 * (1 - 4 / 6)  # alpha = 4 negatives / (7 items - 1)
    neg = np.array([3, 2, 1, 7])
    rows = numpy_rows(
        queries[:, 0], table[targets], targets, table[neg], neg, np.zeros(3), np.zeros(4), 0.5, True
    )
    assert got == pytest.approx(numpy_gbce(rows, beta).mean(), rel=1e-5)


def test_negatives_per_positive_draws_a_set_for_each_target() -> None:
    rng, table, embed = tiny_catalogue(16)
    queries = rng.normal(size=(2, 1, 4)).astype(np.float32)
    targets = np.array([2, 5])
    task = task_for("sampled_softmax", np.ones(8), targets, negatives_per_positive=2)
    fix_negatives(task, [5, 1, 2, 3])  # rows: [5, 1] and [2, 3]: no hits
    got = float(task(tf.constant(queries), tf.constant(targets), embed))
    cand = np.array([[5, 1], [2, 3]])
    logq = np.log(np.full((2, 2), 2 / 7))  # 2 draws per target, q = 1/7: E[count] = 2/7
    rows = numpy_rows(
        queries[:, 0], table[targets], targets, table[cand], cand, np.log(np.full(2, 2 / 7)), logq, 1.0, True
    )
    assert got == pytest.approx(numpy_softmax_ce(rows).mean(), rel=1e-5)


def test_logq_correction_can_be_turned_off() -> None:
    rng, table, embed = tiny_catalogue(17)
    queries = rng.normal(size=(3, 1, 4)).astype(np.float32)
    targets = np.array([1, 3, 6])
    counts = np.array([0, 50, 3, 1, 1, 1, 1, 1])

    def loss(correct: bool) -> float:
        task = task_for("sampled_softmax", counts, targets, sampler="popularity", logq_correction=correct)
        fix_negatives(task, [1, 2, 7])
        return float(task(tf.constant(queries), tf.constant(targets), embed))

    neg = np.array([1, 2, 7])
    rows = numpy_rows(
        queries[:, 0], table[targets], targets, table[neg], neg, np.zeros(3), np.zeros(3), 1.0, True
    )
    assert loss(False) == pytest.approx(numpy_softmax_ce(rows).mean(), rel=1e-5)
    assert loss(True) != pytest.approx(loss(False), rel=1e-2)


def test_logq_correction_makes_sampled_gradients_match_the_full_softmax() -> None:
    """With a skewed sampler the corrected sampled softmax's gradient approaches the full softmax's
    (many draws); without the correction popular items are over-weighted and it does not."""
    rng = np.random.default_rng(18)
    v, dim = 30, 6
    table = rng.normal(size=(v + 1, dim)).astype(np.float32)
    table[0] = 0
    query = rng.normal(size=(1, dim)).astype(np.float32) * 0.5
    target = 12
    counts = np.concatenate([[0], np.arange(v, 0, -1) ** 2])  # skewed towards low ids (q from 900 to 1)
    s = table[1:] @ query[0]
    softmax = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    full = -table[target] + softmax @ table[1:]  # d(full softmax CE)/d query

    def gradient(correct: bool) -> np.ndarray:
        sampler = CandidateSampler.from_counts(counts, "popularity", alpha=1.0, seed=3)
        task = build_task(
            "sampled_softmax",
            sampler=sampler,
            num_negatives=400_000,
            target_probabilities=np.full(v + 1, 1.0 / (v + 1)),
            remove_accidental_hits=False,
            logq_correction=correct,
        )
        q = tf.Variable(query[:, None, :])
        with tf.GradientTape() as tape:
            loss = task(q, tf.constant([target]), lambda ids: tf.gather(tf.constant(table), ids))
        return tape.gradient(loss, q).numpy()[0, 0]

    # Compare the negatives' part of the gradient, E_softmax[e_j] (the -e_target part is exact).
    expected = full + table[target]
    corrected, plain = gradient(True) + table[target], gradient(False) + table[target]
    assert np.linalg.norm(corrected - expected) < 0.03 * np.linalg.norm(expected)
    assert np.linalg.norm(plain - expected) > 0.1 * np.linalg.norm(expected)


@pytest.mark.parametrize("loss", LOSSES)
def test_padding_positions_are_ignored(loss: str) -> None:
    rng, _, embed = tiny_catalogue(19)
    outputs = rng.normal(size=(2, 4, 4)).astype(np.float32)
    targets = np.array([[0, 2, 4, 1], [0, 0, 3, 6]])

    def value(out: np.ndarray) -> float:
        task = task_for(loss, np.ones(8), targets, seed=5)  # same seed: same negatives
        return float(task(tf.constant(out), tf.constant(targets), embed))

    changed = outputs.copy()
    changed[targets == 0] = 100.0  # whatever the tower says where there is no target
    assert value(changed) == pytest.approx(value(outputs), rel=1e-6)
    # The mean runs over the 6 real targets: the per-example losses are one per target.
    task = task_for(loss, np.ones(8), targets, seed=5)
    per_example, ids = task.per_example(tf.constant(outputs), tf.constant(targets), embed)
    np.testing.assert_array_equal(ids.numpy(), [2, 4, 1, 3, 6])  # row-major, padding skipped
    assert per_example.shape == (5,)


def test_log_uniform_sampler_is_zipf_over_the_popularity_rank() -> None:
    counts = np.array(
        [0, 5, 50, 5, 1]
    )  # ranks: item 2 -> 0, item 1 -> 1, item 3 -> 2 (tie by id), item 4 -> 3
    sampler = CandidateSampler.from_counts(counts, "log_uniform", seed=1)
    rank = np.array([1, 0, 2, 3])
    expected = np.log((rank + 2) / (rank + 1)) / np.log(5)
    np.testing.assert_allclose(sampler.probabilities[1:], expected, rtol=1e-12)
    assert sampler.probabilities[0] == 0
    draws = sampler.sample(100_000).numpy()
    freq = np.bincount(draws, minlength=5)[1:] / len(draws)
    np.testing.assert_allclose(freq, expected, atol=0.006)


def test_sampler_draws_are_seeded() -> None:
    a = CandidateSampler.from_counts(np.ones(20), "uniform", seed=4)
    b = CandidateSampler.from_counts(np.ones(20), "uniform", seed=4)
    first = a.sample(50).numpy()
    np.testing.assert_array_equal(first, b.sample(50).numpy())  # same seed, same draws
    assert not np.array_equal(first, a.sample(50).numpy())  # the next draw moves on
    assert int(a.seeds.counter.numpy()) == 2


def test_build_task_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        task_for("hinge", np.ones(5), np.array([1, 2]))
    with pytest.raises(ValueError, match="negatives_per_positive"):
        task_for("bce", np.ones(5), np.array([1, 2]), negatives_per_positive=-1)
    with pytest.raises(ValueError, match="temperature"):
        task_for("in_batch", np.ones(5), np.array([1, 2]), temperature=0.0)


@pytest.mark.parametrize(
    "loss", tiered(LOSSES, slow=set(LOSSES) - {"sampled_softmax", "full_softmax"})
)  # 1-2 s each
def test_a_few_steps_reduce_every_loss(loss: str) -> None:
    """A mean-pool tower learns 'next item = the history's item + 1' (tiny synthetic data)."""
    import keras

    from retrieval.training.config import ModelConfig
    from retrieval.training.model import build_model

    keras.utils.set_random_seed(0)
    num_items = 30
    rng = np.random.default_rng(20)
    last = rng.integers(1, num_items, 256)
    x = np.stack([np.maximum(last - 2, 1), np.maximum(last - 1, 1), last], axis=1).astype(np.int32)
    y = (last % num_items + 1).astype(np.int32)
    model = build_model(ModelConfig(tower="youtubednn", dim=16, max_len=3), num_items + 1)
    model.task = task_for(loss, np.bincount(y, minlength=num_items + 1), y, num_negatives=10, seed=1)
    compile_for_fit(model, 0.02)  # the optimizer built first, as fit_under does: traced once
    history = model.fit({"items": x}, y, batch_size=128, epochs=6, verbose=0).history["loss"]
    assert history[-1] < 0.8 * history[0], history


def test_full_softmax_fused_path_matches_the_generic_logits(monkeypatch) -> None:
    """The fused catalogue cross-entropy gives the loss and gradients of the generic path
    (candidate logits, accidental hit removed, positive logit concatenated)."""
    rng, _, embed = tiny_catalogue(21)
    outputs = tf.Variable(rng.normal(size=(3, 4, 4)).astype(np.float32))  # [B, L, d]: all positions
    targets = tf.constant([[0, 2, 5, 7], [0, 0, 3, 3], [1, 2, 3, 4]])

    def loss_and_gradient() -> tuple[float, np.ndarray]:
        task = task_for("full_softmax", np.ones(8), targets.numpy(), temperature=0.7)
        with tf.GradientTape() as tape:
            loss = task(outputs, targets, embed)
        return float(loss), tape.gradient(loss, outputs).numpy()

    assert RetrievalTask._catalogue_softmax.fget(task_for("full_softmax", np.ones(8), np.array([1])))
    fused = loss_and_gradient()
    monkeypatch.setattr(RetrievalTask, "_catalogue_softmax", property(lambda self: False))
    generic = loss_and_gradient()
    assert fused[0] == pytest.approx(generic[0], rel=1e-5)
    np.testing.assert_allclose(fused[1], generic[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss", ["sampled_softmax", "full_softmax", "gbce"])
def test_max_interest_scores_every_candidate_by_its_best_interest(loss: str) -> None:
    """interest_selection="max": the positive's and each negative's logit is max_k <v_k, e>
    (masked interests skipped), checked against numpy; under "hard" the negatives meet only the
    chosen interest, so the two differ."""
    rng, table, embed = tiny_catalogue(22)
    interests = rng.normal(size=(3, 3, 4)).astype(np.float32)
    interests[1, 2] = 0.0  # a masked interest (MIND's K'u) never counts
    targets = np.array([2, 5, 3])
    negatives = np.array([1, 4, 6, 7, 2])
    task = task_for(loss, np.ones(8), targets, num_negatives=5, interest_selection="max", temperature=0.5)
    fix_negatives(task, negatives)
    got = float(task(tf.constant(interests), tf.constant(targets), embed))

    def best(b: int, ids: np.ndarray) -> np.ndarray:
        active = np.any(interests[b] != 0, axis=1)
        return (interests[b][active] @ table[ids].T).max(axis=0) / 0.5

    expected = []
    for b, t in enumerate(targets):
        candidates = np.arange(1, 8) if loss == "full_softmax" else negatives[negatives != t]
        pos, neg = best(b, np.array([t]))[0], best(b, candidates[candidates != t])
        if loss == "gbce":
            beta = GeneralisedBCE.beta_for(0.75, 5, 7)
            softplus = lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)  # noqa: E731
            expected.append((beta * softplus(-pos) + softplus(neg).sum()) / (1 + len(neg)))
        else:  # uniform sampler: log-Q is the same for every id, so it cancels in the softmax
            logits = np.concatenate([[pos], neg])
            expected.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - pos)
    assert got == pytest.approx(np.mean(expected), rel=1e-5)
    hard = task_for(loss, np.ones(8), targets, num_negatives=5, temperature=0.5)
    fix_negatives(hard, negatives)
    assert float(hard(tf.constant(interests), tf.constant(targets), embed)) != pytest.approx(got, rel=1e-3)
