"""The youtubednn, dr, mind and din towers and sa's attention penalty against numpy references."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from retrieval.training.config import ModelConfig
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import SampledSoftmaxTask
from retrieval.training.model import TwoTowerModel, build_model
from tests.helpers import compile_for_fit
from towers import ItemTower, build_user_tower
from towers.dr import dynamic_interest_count
from towers.sa import attention_penalty_term

NUM_ITEMS, DIM = 40, 16


def make_tower(name: str, max_len: int = 12, **kwargs):
    keras.utils.set_random_seed(0)
    tower = build_user_tower(name, item_tower=ItemTower(NUM_ITEMS + 1, DIM), max_len=max_len, **kwargs)
    tower.build()
    return tower


def left_padded(lengths: list[int], width: int, seed: int = 0) -> np.ndarray:
    """One row per length, random items, left-padded to ``width``."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(lengths), width), np.int32)
    for row, n in zip(out, lengths, strict=True):
        row[width - n :] = rng.integers(1, NUM_ITEMS + 1, n)
    return out


def numpy_squash(s: np.ndarray) -> np.ndarray:
    norm2 = (s**2).sum(-1, keepdims=True)
    return s * norm2 / ((1 + norm2) * np.sqrt(norm2 + 1e-9))


def numpy_routing(u: np.ndarray, b: np.ndarray, active: np.ndarray, iterations: int):
    """Dynamic routing for one user: predictions ``u`` [K, n, d], initial logits ``b`` [K, n]."""
    for step in range(iterations):
        logits = np.where(active[:, None], b, -np.inf)
        c = np.exp(logits - logits.max(axis=0))
        c /= c.sum(axis=0)  # over interests
        v = numpy_squash(np.einsum("kn,knd->kd", c, u))
        if step < iterations - 1:
            b = b + np.einsum("knd,kd->kn", u, v)
    return v, c


def log2_interests(n: int, k: int) -> int:
    """MIND's K'_u with an integer floor(log2 n) (bit_length - 1 for n >= 1)."""
    return max(1, min(k, n.bit_length() - 1 if n > 0 else 0))


# --- MIND / ComiRec-DR -------------------------------------------------------------------------


def test_dynamic_interest_count_is_max_1_min_k_floor_log2() -> None:
    lengths = np.arange(0, 70)
    for k in (1, 2, 4, 6):
        got = np.asarray(dynamic_interest_count(lengths, k))
        np.testing.assert_array_equal(got, [log2_interests(int(n), k) for n in lengths])
    # Worked by hand, K = 4: 1-3 items -> 1, 4-7 -> 2, 8-15 -> 3, 16+ -> 4.
    np.testing.assert_array_equal(
        np.asarray(dynamic_interest_count(np.array([3, 4, 8, 15, 16]), 4)), [1, 2, 3, 3, 4]
    )


def test_mind_zeroes_exactly_the_interests_beyond_k_prime() -> None:
    tower = make_tower("mind", max_len=20, num_interests=4)
    lengths = [1, 2, 3, 4, 7, 8, 15, 16, 20]
    x = left_padded(lengths, 20)
    out = np.asarray(tower({"items": x}))
    routing = np.asarray(tower.attention_maps({"items": x})["routing"])
    for b, n in enumerate(lengths):
        k_u = log2_interests(n, 4)
        assert np.all(out[b, k_u:] == 0.0), (n, k_u)
        assert np.all(np.abs(out[b, :k_u]).sum(-1) > 0), (n, k_u)
        assert np.all(routing[b, k_u:] == 0.0)
        # Each real behaviour is shared out among the active interests only.
        np.testing.assert_allclose(routing[b, :k_u, 20 - n :].sum(0), 1.0, rtol=1e-5)
    # Padding does not change K'_u: the same histories, as tightly padded as possible.
    for b, n in enumerate(lengths):
        tight = np.asarray(tower({"items": x[b : b + 1, 20 - n :]}))
        np.testing.assert_allclose(tight[0], out[b], atol=1e-6)
        assert np.array_equal(tight[0] == 0.0, out[b] == 0.0)


def test_dynamic_interests_default_per_tower_and_from_the_config() -> None:
    assert make_tower("mind").dynamic_interests and not make_tower("dr").dynamic_interests
    model = build_model(ModelConfig(tower="dr", dim=8, dynamic_interests=True, routing_iterations=5), 20)
    assert model.user_tower.dynamic_interests and model.user_tower.routing_iterations == 5
    assert not build_model(
        ModelConfig(tower="mind", dim=8, dynamic_interests=False), 20
    ).user_tower.dynamic_interests
    dr = make_tower("dr", num_interests=4)
    out = np.asarray(dr({"items": left_padded([1, 2], 12)}))
    assert np.all(np.abs(out).sum(-1) > 0)  # dr keeps all K interests by default
    with pytest.raises(ValueError, match="routing_iterations"):
        make_tower("dr", routing_iterations=0)


@pytest.mark.parametrize("name", ["dr", "mind"])
def test_routing_matches_a_numpy_reference(name: str) -> None:
    tower = make_tower(name, max_len=12, num_interests=3)
    lengths = [1, 3, 5, 9, 12]
    x = left_padded(lengths, 12, seed=1)
    out = np.asarray(tower({"items": x}))
    routing = np.asarray(tower.attention_maps({"items": x})["routing"])
    table = np.asarray(tower.item_tower.table)
    kernel = np.asarray(tower.bilinear.kernel)
    for b, n in enumerate(lengths):
        h = table[x[b, 12 - n :]]  # [n, d], oldest first
        if name == "dr":  # one map per interest: u_k = h W_k; logits start at 0; all K active
            u = (h @ kernel).reshape(n, 3, DIM).transpose(1, 0, 2)
            b0, active = np.zeros((3, n)), np.ones(3, bool)
        else:  # one shared map; stored logits by recency (newest = column 0); K'_u interests
            u = np.broadcast_to(h @ kernel, (3, n, DIM))
            b0 = np.asarray(tower.stored_logits)[:, np.arange(n)[::-1]]
            active = np.arange(3) < log2_interests(n, 3)
        v, c = numpy_routing(u, b0, active, iterations=3)
        if name == "mind":
            w, bias = (np.asarray(t) for t in tower.output_layer.weights)
            v = np.maximum(v @ w + bias, 0.0) * active[:, None]
        np.testing.assert_allclose(out[b], v, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(routing[b, :, 12 - n :], c, rtol=1e-4, atol=1e-6)
        assert np.all(routing[b, :, : 12 - n] == 0.0)


def test_routing_coefficients_get_no_gradient() -> None:
    """Gradients reach the bilinear map only through the last round, with the coupling held fixed."""
    tower = make_tower("dr", num_interests=3)
    x = left_padded([4, 9, 12], 12, seed=2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tower({"items": x}) ** 2)
    got = tape.gradient(loss, tower.bilinear.kernel)
    c = tf.constant(tower.attention_maps({"items": x})["routing"])  # held constant
    with tf.GradientTape() as tape:
        u = tower.predictions(tower.item_tower(x))  # [B, K, L, d]
        s = tf.einsum("bkl,bkld->bkd", c, u)
        norm2 = tf.reduce_sum(s**2, -1, keepdims=True)
        loss = tf.reduce_sum((s * norm2 / ((1 + norm2) * tf.sqrt(norm2 + 1e-9))) ** 2)
    expected = tape.gradient(loss, tower.bilinear.kernel)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-9)


def test_mind_initial_logits_are_a_fixed_non_trainable_weight() -> None:
    tower = make_tower("mind")
    assert any(w is tower.stored_logits for w in tower.non_trainable_weights)
    assert all(w is not tower.stored_logits for w in tower.trainable_weights)
    x = left_padded([5, 12], 12)
    np.testing.assert_array_equal(np.asarray(tower({"items": x})), np.asarray(tower({"items": x})))
    assert np.asarray(tower.stored_logits).std() > 0.5  # a real random draw, not zeros


# --- DIN ---------------------------------------------------------------------------------------


def numpy_din(tower, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interests [B, K, d] and weights [B, K, L] recomputed from the layer's weights."""
    table = np.asarray(tower.item_tower.table)
    layers = [*tower.hidden, tower.weight_layer]
    params = [tuple(np.asarray(w) for w in layer.weights) for layer in layers]
    learned = np.asarray(tower.learned_queries)
    outs, weights = [], []
    for row in x:
        h = table[row]  # [L, d] (padding included, masked below)
        queries = np.concatenate([h[-1:], learned])  # newest item first
        w = np.zeros((len(queries), len(row)))
        for k, q in enumerate(queries):
            z = np.concatenate([h, np.broadcast_to(q, h.shape), h - q, h * q], axis=1)
            for i, (kernel, bias) in enumerate(params):
                z = z @ kernel + bias
                if i < len(params) - 1:
                    z = 1 / (1 + np.exp(-z))  # sigmoid hidden layers
            w[k] = np.where(row > 0, z[:, 0], 0.0)
        weights.append(w)
        outs.append(w @ h)
    return np.array(outs), np.array(weights)


def test_din_matches_numpy_and_its_weights_are_not_normalised() -> None:
    tower = make_tower("din", num_interests=3, attention_units=(8, 4))
    x = left_padded([2, 5, 12], 12, seed=3)
    expected_out, expected_w = numpy_din(tower, x)
    np.testing.assert_allclose(np.asarray(tower({"items": x})), expected_out, rtol=1e-4, atol=1e-6)
    w = np.asarray(tower.attention_maps({"items": x})["activation"])
    np.testing.assert_allclose(w, expected_w, rtol=1e-4, atol=1e-6)
    assert np.abs(w.sum(-1) - 1).max() > 0.1  # not a distribution over the history
    # Scaling the activation unit's output layer scales weights and interests alike (a softmax
    # would cancel it).
    before = np.asarray(tower({"items": x}))
    for variable in tower.weight_layer.weights:
        variable.assign(2.0 * np.asarray(variable))
    np.testing.assert_allclose(np.asarray(tower({"items": x})), 2.0 * before, rtol=1e-4, atol=1e-6)


def test_din_first_query_is_the_most_recent_item() -> None:
    tower = make_tower("din", num_interests=3)
    x = left_padded([3, 7], 12, seed=4)
    before = np.asarray(tower({"items": x}))
    tower.learned_queries.assign(np.ones((2, DIM), np.float32))
    after = np.asarray(tower({"items": x}))
    np.testing.assert_allclose(after[:, 0], before[:, 0], atol=1e-6)  # query 0 is not learned
    assert np.abs(after[:, 1:] - before[:, 1:]).max() > 1e-4
    changed = x.copy()
    changed[:, -1] = NUM_ITEMS  # a different newest item moves interest 0
    assert np.abs(np.asarray(tower({"items": changed}))[:, 0] - before[:, 0]).max() > 1e-4


# --- YouTube DNN -------------------------------------------------------------------------------


def test_youtubednn_is_an_mlp_over_the_masked_mean() -> None:
    tower = make_tower("youtubednn", hidden_units=(8, 6))
    x = left_padded([1, 4, 12], 12, seed=5)
    table = np.asarray(tower.item_tower.table)
    out = np.asarray(tower({"items": x}))
    for b, row in enumerate(x):
        z = table[row[row > 0]].mean(axis=0)
        for layer in tower.hidden:
            kernel, bias = (np.asarray(w) for w in layer.weights)
            z = np.maximum(z @ kernel + bias, 0.0)
        kernel, bias = (np.asarray(w) for w in tower.output_layer.weights)
        np.testing.assert_allclose(out[b, 0], z @ kernel + bias, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="single-interest"):
        make_tower("youtubednn", num_interests=2)


# --- ComiRec-SA's attention penalty ------------------------------------------------------------


def test_attention_penalty_term_matches_numpy() -> None:
    rng = np.random.default_rng(6)
    a = rng.dirichlet(np.ones(7), size=(5, 3)).astype(np.float32)  # [B, K, L]
    expected = np.mean([((m @ m.T - np.eye(3)) ** 2).sum() for m in a])
    assert float(attention_penalty_term(tf.constant(a))) == pytest.approx(expected, rel=1e-5)
    # Worked by hand: two heads on the same single position -> A Aᵀ = [[1, 1], [1, 1]] -> 2.
    same = np.array([[[1.0, 0.0], [1.0, 0.0]]], np.float32)
    assert float(attention_penalty_term(tf.constant(same))) == pytest.approx(2.0)


def test_attention_penalty_reaches_the_training_loss() -> None:
    """``add_loss`` in the tower arrives in ``fit``'s loss (Keras 3), and only when training."""
    x, y = left_padded([2, 6, 12, 9], 12, seed=7), np.array([7, 8, 9, 10], np.int32)
    fixed = tf.constant([1, 2, 3, 4, 5])

    def first_step_loss(weight: float) -> tuple[float, TwoTowerModel]:
        model = TwoTowerModel(make_tower("sa", num_interests=3, attention_penalty=weight))  # same seed
        sampler = CandidateSampler.from_counts(np.ones(NUM_ITEMS + 1), "uniform")
        model.task = SampledSoftmaxTask(sampler, num_negatives=5)
        model.task.sampler.sample = lambda n: fixed  # type: ignore[method-assign]
        model.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=False)
        return float(model.train_on_batch({"items": x}, y)), model

    plain, _ = first_step_loss(0.0)
    with_penalty, model = first_step_loss(0.5)
    a = np.asarray(model.user_tower.attention({"items": x})[0])
    penalty = np.mean([((m @ m.T - np.eye(3)) ** 2).sum() for m in a])
    assert with_penalty - plain == pytest.approx(0.5 * penalty, rel=1e-4)
    model.user_tower({"items": x}, training=False)
    assert not model.user_tower.losses  # inference adds nothing


def test_attention_penalty_makes_heads_attend_to_different_items() -> None:
    keras.utils.set_random_seed(0)
    model = build_model(
        ModelConfig(tower="sa", dim=DIM, max_len=12, num_interests=3, attention_penalty=1.0), 41
    )
    assert model.user_tower.attention_penalty == 1.0
    sampler = CandidateSampler.from_counts(np.ones(NUM_ITEMS + 1), "uniform")
    model.task = SampledSoftmaxTask(sampler, num_negatives=10)
    compile_for_fit(model, 0.05)
    x, y = left_padded([12] * 32, 12, seed=8), np.arange(32, dtype=np.int32) % NUM_ITEMS + 1

    def penalty() -> float:
        return float(attention_penalty_term(model.user_tower.attention({"items": x})[0]))

    before = penalty()
    model.fit({"items": x}, y, batch_size=32, epochs=20, verbose=0)
    assert penalty() < 0.5 * before
