"""The training task against numpy re-implementations."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from retrieval.losses import (
    CandidateSampler,
    SampledSoftmaxTask,
    label_aware_attention,
    sampled_softmax_loss,
    select_interest,
)


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
    import retrieval.train
    from retrieval.config import Config, apply_overrides

    built: list[SampledSoftmaxTask] = []

    class Recording(SampledSoftmaxTask):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(retrieval.train, "SampledSoftmaxTask", Recording)
    monkeypatch.setattr(retrieval.train, "save_model", lambda *args, **kwargs: None)  # not under test
    overrides = [f"data.path={synthetic_csv}", "model.tower=mind", "model.dim=8", "model.max_len=6"]
    overrides += ["train.epochs=1", "train.num_negatives=5", "train.interest_selection=label_aware"]
    config = apply_overrides(Config(), [*overrides, "train.label_aware_power=3"])
    retrieval.train.train(config, tmp_path / "model", verbose=0)
    (task,) = built
    assert (task.interest_selection, task.label_aware_power) == ("label_aware", 3.0)
