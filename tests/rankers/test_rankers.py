"""Rankers: the shared contract (shapes, padding, serialization, training) and numpy oracles."""

from __future__ import annotations

import ast
from itertools import combinations

import keras
import numpy as np
import pytest

from rankers import AFM, DIEN, DIN, DSTN, build_ranker, click_loss, ranker_names
from rankers.layers import AUGRUCell, Dice
from tests.helpers import (
    RANKER_ATTRIBUTES,
    RANKER_CONTEXT,
    RANKER_DIM,
    RANKER_ITEMS,
    RANKER_MAX_LEN,
    REPO_ROOT,
    compile_for_fit,
    make_ranker,
    tiered,
)

# The shared ranker fixture's sizes (tests/helpers.py, also used by tests/rankers/test_ranker_xla.py).
NUM_ITEMS, DIM, MAX_LEN, NUM_ATTRIBUTES = RANKER_ITEMS, RANKER_DIM, RANKER_MAX_LEN, RANKER_ATTRIBUTES
CLUSTER_SIZE = 6  # items 1..24 in 4 clusters of 6: cluster(i) = (i - 1) // 6
CONTEXT = RANKER_CONTEXT  # DSTN's context size in these tests (the requests carry CONTEXT + 1 context items)


def attributes_of(ids: np.ndarray) -> np.ndarray:
    """Each item's attribute ids ``[..., 2]``: its cluster (1..4) and its parity (5, 6); 0 for padding."""
    out = np.stack([(ids - 1) // CLUSTER_SIZE + 1, ids % 2 + 5], axis=-1)
    return np.where(ids[..., None] > 0, out, 0).astype(np.int32)


def requests(
    seed: int, batch: int = 4, length: int = MAX_LEN, num_candidates: int = 5, attributes: bool = True
) -> dict[str, np.ndarray]:
    """Left-padded histories (at least one item), candidates (row 0's last is padding), unclicked
    items, retrieval scores (-inf in the padded slot, as a retriever's empty slot) and a context
    (CONTEXT + 1 distinct items, row 0's last is padding)."""
    rng = np.random.default_rng(seed)
    history = np.zeros((batch, length), np.int32)
    for row in history:
        n = rng.integers(1, length + 1)
        row[length - n :] = rng.integers(1, NUM_ITEMS + 1, n)
    candidates = rng.integers(1, NUM_ITEMS + 1, (batch, num_candidates)).astype(np.int32)
    candidates[0, -1] = 0
    unclicked = rng.integers(0, NUM_ITEMS + 1, (batch, 3)).astype(np.int32)
    scores = rng.normal(size=(batch, num_candidates)).astype(np.float32)
    scores[0, -1] = -np.inf
    context = np.stack([rng.permutation(NUM_ITEMS)[: CONTEXT + 1] + 1 for _ in range(batch)]).astype(np.int32)
    context[0, -1] = 0
    x = {
        "history": history,
        "candidates": candidates,
        "unclicked": unclicked,
        "retrieval_scores": scores,
        "context": context,
    }
    if attributes:
        x["history_attributes"] = attributes_of(history)
        x["candidate_attributes"] = attributes_of(candidates)
    return x


def logits(ranker, x: dict[str, np.ndarray], training: bool = False) -> np.ndarray:
    return np.asarray(ranker(x, training=training))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# --- the contract every ranker keeps ---------------------------------------------------------


def test_registry_has_the_four_rankers_and_rejects_unknown() -> None:
    assert set(ranker_names()) == {"afm", "dien", "din", "dstn"}
    with pytest.raises(ValueError, match="unknown ranker 'nope'"):
        build_ranker("nope", num_items=3, dim=4, max_len=2)


@pytest.mark.parametrize("name", ranker_names())
@pytest.mark.parametrize("num_attributes", [0, NUM_ATTRIBUTES])
def test_output_is_finite_logits_per_candidate(name: str, num_attributes: int) -> None:
    ranker = make_ranker(name, num_attributes=num_attributes)
    x = requests(0, attributes=num_attributes > 0)
    out = logits(ranker, x)
    assert out.shape == (4, 5) and out.dtype == np.float32
    assert np.all(np.isfinite(out))
    assert out[0, -1] == 0.0  # the padded candidate
    assert np.abs(out[x["candidates"] > 0]).max() > 0


@pytest.mark.parametrize("name", ranker_names())
@pytest.mark.parametrize("training", [False, True])
def test_padded_candidates_change_no_other_logit(name: str, training: bool) -> None:
    ranker = make_ranker(name)
    x = requests(1)
    more = dict(x)
    more["candidates"] = np.concatenate([x["candidates"], np.zeros((4, 3), np.int32)], axis=1)
    more["candidate_attributes"] = attributes_of(more["candidates"])
    # Whatever the scores of padded slots say (a retriever's empty slot holds -inf).
    more["retrieval_scores"] = np.concatenate([x["retrieval_scores"], np.full((4, 3), 7.0, np.float32)], 1)
    # Training mode too: Dice's batch statistics must ignore the padded rows.
    base, padded = logits(ranker, x, training), logits(ranker, more, training)
    np.testing.assert_allclose(padded[:, :5], base, atol=1e-5)
    assert np.all(padded[:, 5:] == 0.0) and base[0, -1] == 0.0


@pytest.mark.parametrize("name", ranker_names())
def test_left_padding_does_not_change_the_logits(name: str) -> None:
    ranker = make_ranker(name)
    x = requests(2, length=6)
    wider = dict(x)
    wider["history"] = np.concatenate([np.zeros((4, 2), np.int32), x["history"]], axis=1)
    wider["history_attributes"] = attributes_of(wider["history"])
    before = logits(ranker, x)
    np.testing.assert_allclose(logits(ranker, wider), before, atol=1e-5)
    # Nor do the padding rows' embeddings leak in: change them and compare.
    for table in (ranker.item_tower.table, ranker.attribute_table.embeddings):
        table.assign(np.concatenate([np.full((1, DIM), 5.0, np.float32), np.asarray(table)[1:]]))
    np.testing.assert_allclose(logits(ranker, wider), before, atol=1e-5)


@pytest.mark.parametrize("name", ranker_names())
def test_only_the_last_max_len_history_items_are_read(name: str) -> None:
    ranker = make_ranker(name)
    x = requests(16, length=MAX_LEN + 3)
    x["history"][:, :3] = np.arange(1, 4)  # older items beyond max_len
    x["history_attributes"] = attributes_of(x["history"])
    last = {**x, "history": x["history"][:, 3:], "history_attributes": x["history_attributes"][:, 3:]}
    np.testing.assert_allclose(logits(ranker, x), logits(ranker, last), atol=1e-6)


def test_rankers_import_only_keras_numpy_tensorflow_and_towers() -> None:
    root = REPO_ROOT / "rankers"
    allowed = {"__future__", "abc", "collections", "itertools", "typing", "keras", "numpy", "tensorflow"}
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for top in (name.split(".")[0] for name in names):
                assert top in allowed | {"rankers", "towers"}, f"{path.name} imports {top}"


@pytest.mark.parametrize("name", ranker_names())
def test_all_padding_history_gives_finite_logits(name: str) -> None:
    ranker = make_ranker(name)
    x = requests(3)
    x["history"][:] = 0
    x["history_attributes"][:] = 0
    assert np.all(np.isfinite(logits(ranker, x))) and np.all(np.isfinite(logits(ranker, x, True)))


@pytest.mark.parametrize("name", ranker_names())
@pytest.mark.parametrize("retrieval_score", [True, False])
def test_config_round_trip_gives_identical_logits(name: str, retrieval_score: bool) -> None:
    ranker = make_ranker(name, retrieval_score=retrieval_score, ranker_scale_init=0.25)
    x = requests(4)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(ranker))
    assert clone.built  # the build config in the serialized form rebuilds the weights
    assert clone.get_config() == ranker.get_config()
    assert (clone.retrieval_score, clone.ranker_scale_init) == (retrieval_score, 0.25)
    assert len(clone.weights) == len(ranker.weights)  # g, w, b exist only with the option
    clone.set_weights(ranker.get_weights())
    np.testing.assert_allclose(logits(clone, x), logits(ranker, x), atol=1e-6)


@pytest.mark.parametrize("name", ranker_names())
def test_keras_file_round_trip_gives_identical_logits(name: str, tmp_path) -> None:
    ranker = make_ranker(name)
    ranker.retrieval_weight.assign(1.7)  # and the affine retrieval term is saved with the weights
    x = requests(5)
    ranker(x, training=True)  # moves Dice's averages away from their initial values
    expected = logits(ranker, x)
    ranker.save(tmp_path / "ranker.keras")
    loaded = keras.saving.load_model(tmp_path / "ranker.keras")
    assert type(loaded) is type(ranker) and loaded.retrieval_score
    np.testing.assert_allclose(logits(loaded, x), expected, atol=1e-6)


# --- the retriever's score as an input --------------------------------------------------------


@pytest.mark.parametrize("name", ranker_names())
def test_an_untrained_ranker_orders_exactly_like_the_retriever(name: str) -> None:
    ranker = make_ranker(name, ranker_scale_init=0.0)  # the default start: g = 0, w = 1, b = 0
    x = requests(20, num_candidates=7)
    out = logits(ranker, x)
    real = x["candidates"] > 0
    np.testing.assert_array_equal(out[real], x["retrieval_scores"][real])
    assert np.all(out[~real] == 0.0)
    order = np.argsort(-np.where(real, out, -np.inf), axis=1, kind="stable")
    np.testing.assert_array_equal(order, np.argsort(-x["retrieval_scores"], axis=1, kind="stable"))
    # The ranker's own part is really there, only scaled by g = 0: with g = 1 the order changes.
    ranker.ranker_scale.assign(1.0)
    moved = logits(ranker, x)
    assert np.abs(moved[real] - x["retrieval_scores"][real]).max() > 0  # AFM's part starts tiny


@pytest.mark.parametrize("name", ranker_names())
def test_the_logit_is_the_scaled_ranker_part_plus_an_affine_retrieval_term(name: str) -> None:
    ranker = make_ranker(name)
    plain = make_ranker(name, retrieval_score=False)  # same seed: the same own weights
    x = requests(21)
    own = logits(plain, x)  # f(x), the ranker alone
    ranker.set_blend(0.7, 2.0, -0.3)
    real = x["candidates"] > 0
    expected = np.where(real, 0.7 * own + 2.0 * np.where(real, x["retrieval_scores"], 0) - 0.3, 0.0)
    np.testing.assert_allclose(logits(ranker, x), expected, rtol=1e-5, atol=1e-5)
    # Without the option the scores are ignored; with it they are required.
    np.testing.assert_array_equal(logits(plain, {**x, "retrieval_scores": 3 * x["retrieval_scores"]}), own)
    with pytest.raises(ValueError, match="retrieval_scores"):
        ranker({k: v for k, v in x.items() if k != "retrieval_scores"})


@pytest.mark.parametrize("name", tiered(ranker_names(), slow={"dien", "dstn", "afm"}))  # 1-3 s of CPU each
def test_training_from_the_retrievers_order_learns_the_rankers_part(name: str) -> None:
    # From the default start (g = 0) with uninformative retrieval scores: the gate must open.
    ranker = make_ranker(name, ranker_scale_init=0.0)
    x, y = clustered_task()
    x["retrieval_scores"] = np.random.default_rng(1).normal(size=y.shape).astype(np.float32)
    mask = x["candidates"] > 0
    before = float(click_loss(y, ranker(x), mask))
    compile_for_fit(ranker, 0.02)
    # 60 steps: AFM's own logit starts near 0 (zero biases, tiny products), so g = 0 and f ≈ 0
    # are close to a saddle that takes it ~40 steps to leave; the others leave at once.
    ranker.fit(x, y, batch_size=16, epochs=10, shuffle=False, verbose=0)
    after = float(click_loss(y, ranker(x), mask))
    print(f"{name}: {before:.3f} -> {after:.3f}, g = {float(ranker.ranker_scale):.3f}")
    assert after < 0.7 * before and abs(float(ranker.ranker_scale)) > 0.05


def clustered_task(n: int = 96, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Histories inside one cluster; a candidate is clicked iff it is in the cluster of the newest item."""
    rng = np.random.default_rng(seed)
    x = requests(seed, batch=n, num_candidates=6)
    for row in range(n):
        cluster = rng.integers(4)
        n_items = rng.integers(2, MAX_LEN + 1)
        x["history"][row] = 0
        x["history"][row, MAX_LEN - n_items :] = cluster * CLUSTER_SIZE + rng.integers(
            1, CLUSTER_SIZE + 1, n_items
        )
        x["candidates"][row, :2] = cluster * CLUSTER_SIZE + rng.integers(1, CLUSTER_SIZE + 1, 2)
        x["unclicked"][row] = (cluster + 1) % 4 * CLUSTER_SIZE + rng.integers(1, CLUSTER_SIZE + 1, 3)
    x["candidates"][::3, -1] = 0  # some padded candidates
    x["history_attributes"] = attributes_of(x["history"])
    x["candidate_attributes"] = attributes_of(x["candidates"])
    newest_cluster = (x["history"][:, -1:] - 1) // CLUSTER_SIZE
    labels = ((x["candidates"] - 1) // CLUSTER_SIZE == newest_cluster) & (x["candidates"] > 0)
    return x, labels.astype(np.float32)


# 1-3 s of CPU each, all in the full suite: the fast tier trains DIN above (learns the ranker's part)
@pytest.mark.parametrize("name", tiered(ranker_names(), slow=set(ranker_names())))
def test_a_few_training_steps_reduce_the_click_loss(name: str) -> None:
    ranker = make_ranker(name)
    x, y = clustered_task()
    mask = x["candidates"] > 0

    def loss() -> float:
        return float(click_loss(y, ranker(x, training=False), mask))

    before = loss()
    compile_for_fit(ranker, 0.02)
    ranker.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0)  # 30 steps
    after = loss()
    print(f"{name}: click loss {before:.3f} -> {after:.3f}")
    assert after < 0.7 * before


def test_click_loss_is_the_masked_mean_of_bce() -> None:
    labels = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], np.float32)
    z = np.array([[2.0, -1.0, 0.5], [3.0, 0.2, 100.0]], np.float32)
    mask = np.array([[True, True, False], [True, True, False]])
    bce = np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))  # stable −log σ form
    expected = bce[mask].mean()  # the masked-out 100.0 logit would dominate otherwise
    np.testing.assert_allclose(float(click_loss(labels, z, mask)), expected, rtol=1e-5)


# --- DIN -----------------------------------------------------------------------------------


def test_din_activation_weights_match_numpy_and_are_not_normalised() -> None:
    ranker: DIN = make_ranker("din", num_attributes=0, attention_units=(6, 5))
    x = requests(6, attributes=False)
    w = np.asarray(ranker.attention(x))  # [B, C, L]
    user = np.asarray(ranker.user_vectors(x))
    table = np.asarray(ranker.item_tower.table)
    layers = [(np.asarray(layer.kernel), np.asarray(layer.bias)) for layer in ranker.unit.hidden]
    w_out, b_out = np.asarray(ranker.unit.weight_layer.kernel), np.asarray(ranker.unit.weight_layer.bias)
    b = 1
    hist, cands = x["history"][b], x["candidates"][b]
    for c, cand in enumerate(cands):
        q = table[cand]
        expected = np.zeros(MAX_LEN, np.float32)
        for pos, item in enumerate(hist):
            if item == 0:
                continue
            k = table[item]
            z = np.concatenate([k, q, k - q, k * q])
            for kernel, bias in layers:
                z = sigmoid(z @ kernel + bias)
            expected[pos] = (z @ w_out + b_out)[0]
        np.testing.assert_allclose(w[b, c], expected, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(user[b, c], expected @ table[hist], rtol=1e-4, atol=1e-6)
    real = x["history"] > 0
    sums = w.sum(-1)
    assert np.all(w[np.broadcast_to(~real[:, None, :], w.shape)] == 0.0)
    assert np.abs(sums - 1.0).min() > 1e-3  # not a softmax: no candidate's weights sum to 1


def test_din_all_padding_history_gives_a_zero_user_vector() -> None:
    ranker: DIN = make_ranker("din")
    x = requests(7)
    x["history"][:] = 0
    x["history_attributes"][:] = 0
    assert np.all(np.asarray(ranker.user_vectors(x)) == 0.0)


def test_din_mini_batch_aware_l2_matches_numpy() -> None:
    ranker: DIN = make_ranker("din", mba_l2=0.3)
    x = requests(8)
    table = np.asarray(ranker.item_tower.table)
    ids = np.concatenate([x["history"].ravel(), x["candidates"].ravel()])
    unique, counts = np.unique(ids[ids > 0], return_counts=True)
    assert counts.max() > 1  # some ids repeat, so the 1/frequency scaling is exercised
    expected = 0.3 * sum((table[j] ** 2).sum() / n for j, n in zip(unique, counts, strict=True))
    np.testing.assert_allclose(float(ranker.mba_penalty(x)), expected, rtol=1e-5)
    ranker(x, training=True)
    assert len(ranker.losses) == 1
    np.testing.assert_allclose(float(ranker.losses[0]), expected, rtol=1e-5)
    ranker(x, training=False)
    assert not ranker.losses  # only in training
    off = make_ranker("din", mba_l2=0.0)
    off(x, training=True)
    assert not off.losses


def test_dice_uses_valid_batch_statistics_in_training_and_averages_at_inference() -> None:
    dice = Dice(momentum=0.9)
    dice.build((None, 3))
    dice.alpha.assign(np.array([0.5, -0.2, 0.1], np.float32))
    rng = np.random.default_rng(9)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    valid = np.array([True, True, True, False, True, False])

    def numpy_dice(x: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
        p = sigmoid((x - mean) / np.sqrt(var + 1e-8))
        return p * x + (1 - p) * np.array([0.5, -0.2, 0.1]) * x

    mean, var = x[valid].mean(0), x[valid].var(0)
    out = np.asarray(dice(x, valid=valid, training=True))
    np.testing.assert_allclose(out, numpy_dice(x, mean, var), rtol=1e-4, atol=1e-6)
    changed = x.copy()
    changed[~valid] = 100.0  # invalid rows never reach the statistics
    out2 = np.asarray(dice(changed, valid=valid, training=True))
    np.testing.assert_allclose(out2[valid], out[valid], rtol=1e-4, atol=1e-6)
    # Two updates with momentum 0.9 from (0, 1), same batch statistics.
    moving_mean = 0.9 * (0.1 * mean) + 0.1 * mean
    moving_var = 0.9 * (0.9 + 0.1 * var) + 0.1 * var
    np.testing.assert_allclose(np.asarray(dice.moving_mean), moving_mean, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(dice(x, training=False)), numpy_dice(x, moving_mean, moving_var), rtol=1e-4, atol=1e-6
    )


# --- DIEN ----------------------------------------------------------------------------------


def numpy_augru_step(cell: AUGRUCell, x: np.ndarray, h: np.ndarray, a: np.ndarray) -> np.ndarray:
    u = cell.units
    kernel, recurrent, bias = (np.asarray(w) for w in (cell.kernel, cell.recurrent_kernel, cell.bias))
    gx, gh = x @ kernel + bias, h @ recurrent
    update = sigmoid(gx[:, :u] + gh[:, :u])
    reset = sigmoid(gx[:, u : 2 * u] + gh[:, u : 2 * u])
    candidate = np.tanh(gx[:, 2 * u :] + reset * gh[:, 2 * u :])
    update = a * update
    return (1 - update) * h + update * candidate


def test_augru_step_matches_numpy_and_zero_attention_keeps_the_state() -> None:
    keras.utils.set_random_seed(0)
    cell = AUGRUCell(4, 3)
    cell.build()
    cell.bias.assign(np.linspace(-0.5, 0.5, 12).astype(np.float32))
    rng = np.random.default_rng(10)
    x, h = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    a = np.array([[0.0], [0.2], [0.5], [1.0], [0.7]], np.float32)
    out = np.asarray(cell.step(x, h, a))
    np.testing.assert_allclose(out, numpy_augru_step(cell, x, h, a), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[0], h[0])  # a_t = 0: the state is carried unchanged
    assert np.abs(out[1:] - h[1:]).min() > 0
    # As an RNN cell the attention score is the input's last column.
    via_call, _ = cell(np.concatenate([x, a], axis=1), [h])
    np.testing.assert_allclose(np.asarray(via_call), out, atol=1e-6)


def test_dien_attention_and_evolution_match_a_numpy_loop() -> None:
    ranker: DIEN = make_ranker("dien", num_attributes=0)
    x = requests(11, attributes=False)
    states = np.asarray(ranker.interest_states(x))
    table, w = np.asarray(ranker.item_tower.table), np.asarray(ranker.attention_kernel)
    e = table[x["candidates"]]
    a = np.asarray(ranker.attention(states, e, x["history"]))
    final = np.asarray(ranker.evolve(states, a, x["history"]))
    for b in range(4):
        real = np.flatnonzero(x["history"][b])
        assert np.all(states[b, x["history"][b] == 0] == 0.0)
        for c in range(5):
            scores = states[b, real] @ w @ e[b, c]
            expected_a = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            np.testing.assert_allclose(a[b, c, real], expected_a, rtol=1e-4, atol=1e-6)
            h = np.zeros((1, DIM), np.float32)
            for t, weight in zip(real, expected_a, strict=True):
                h = numpy_augru_step(ranker.cell, states[b, t][None], h, np.array([[weight]]))
            np.testing.assert_allclose(final[b, c], h[0], rtol=1e-4, atol=1e-5)


def test_dien_auxiliary_loss_matches_numpy_and_is_added_only_when_weighted() -> None:
    ranker: DIEN = make_ranker("dien", num_attributes=0, aux_weight=0.5)
    x = requests(12, attributes=False)
    states = np.asarray(ranker.interest_states(x))
    table = np.asarray(ranker.item_tower.table)
    history = x["history"]
    negatives = np.random.default_rng(0).integers(1, NUM_ITEMS + 1, (4, MAX_LEN - 1)).astype(np.int32)
    terms = []
    for b in range(4):
        for t in range(MAX_LEN - 1):
            if history[b, t] and history[b, t + 1]:
                pos, neg = states[b, t] @ table[history[b, t + 1]], states[b, t] @ table[negatives[b, t]]
                terms.append(-np.log(sigmoid(pos)) - np.log(1 - sigmoid(neg)))
    got = float(ranker.auxiliary_loss(states, history, negatives))
    np.testing.assert_allclose(got, np.mean(terms), rtol=1e-5)
    sampled = np.asarray(ranker.sample_negatives(history))
    assert sampled.shape == (4, MAX_LEN - 1) and sampled.min() >= 1 and sampled.max() <= NUM_ITEMS
    assert not np.any(sampled == history[:, 1:])
    ranker(x, training=True)
    assert len(ranker.losses) == 1 and float(ranker.losses[0]) > 0
    ranker(x, training=False)
    assert not ranker.losses
    off = make_ranker("dien", aux_weight=0.0)
    off(x, training=True)
    assert not off.losses


# --- DSTN ----------------------------------------------------------------------------------


@pytest.mark.parametrize("context_size", [0, CONTEXT])
def test_dstn_interactive_attention_matches_numpy_exp_and_excludes_the_candidate_itself(
    context_size: int,
) -> None:
    ranker: DSTN = make_ranker("dstn", num_attributes=0, context_size=context_size)
    x = requests(13, attributes=False)
    x["candidates"][1, 2] = x["candidates"][1, 0]  # a duplicate: context when N = 0 (by position)
    x["candidates"][2, 1] = x["context"][2, 1]  # a candidate among the context items
    alpha = {key: np.asarray(value) for key, value in ranker.attention(x).items()}
    table = np.asarray(ranker.item_tower.table)
    d = DIM
    context = x["context"][:, : CONTEXT + 1] if context_size else x["candidates"]
    aux_ids = {"context": context, "clicked": x["history"], "unclicked": x["unclicked"]}

    def context_seen(b: int, c: int) -> list[bool]:
        """N = 0: every other position. N > 0: the first N real context items other than the candidate."""
        if not context_size:
            return [aux != 0 and i != c for i, aux in enumerate(context[b])]
        seen, taken = [], 0
        for aux in context[b]:
            ok = aux != 0 and aux != x["candidates"][b, c] and taken < context_size
            taken += ok
            seen.append(ok)
        return seen

    for name, ids in aux_ids.items():
        layer = ranker.attentions[name]
        kernel, bias, h, b_out = (np.asarray(v) for v in (layer.kernel, layer.bias, layer.h, layer.out_bias))
        for b in range(4):
            for c, target in enumerate(x["candidates"][b]):
                seen = context_seen(b, c) if name == "context" else [aux != 0 for aux in ids[b]]
                for i, aux in enumerate(ids[b]):
                    hidden = np.maximum(table[target] @ kernel[:d] + table[aux] @ kernel[d:] + bias, 0)
                    expected = np.exp(hidden @ h + b_out) if seen[i] else 0.0
                    np.testing.assert_allclose(alpha[name][b, c, i], expected, rtol=1e-4)
    context_alpha = alpha["context"]
    if context_size:
        # N items per candidate; row 0's context has N real items only, and 1 of them is a
        # candidate of row 0 at most once, so some see N - 1 there. Row 2's candidate 1 is the
        # context's item 1: never its own context.
        assert context_alpha[2, 1, 1] == 0.0
        assert np.all((context_alpha[1:] > 0).sum(-1) == CONTEXT)
    else:
        assert np.all(np.diagonal(context_alpha, axis1=1, axis2=2) == 0.0)
        assert context_alpha[1, 0, 2] > 0 and context_alpha[1, 2, 0] > 0
    # Not normalised: a softmax would sum to 1, these grow with the number of clicked items.
    assert alpha["clicked"].sum(-1).max() > 2.0
    # Without the unclicked input that set is empty: its aggregate is zero, the logits stay finite.
    del x["unclicked"]
    assert set(ranker.attention(x)) == {"context", "clicked"}
    assert np.all(np.isfinite(logits(ranker, x)))


def test_dstn_context_has_the_same_size_and_effect_for_any_number_of_candidates() -> None:
    # The train/test mismatch this fixes: 21 candidates in training, 200 at test time. With a
    # fixed-size context a candidate's logit no longer depends on how many others are scored.
    ranker: DSTN = make_ranker("dstn")
    x = requests(22, num_candidates=4)
    x["candidates"][0, -1] = 5
    x["retrieval_scores"][0, -1] = 0.5
    x["candidate_attributes"] = attributes_of(x["candidates"])
    rng = np.random.default_rng(22)
    more = {**x, "candidates": np.concatenate([x["candidates"], rng.integers(1, 25, (4, 36))], axis=1)}
    more["candidates"] = more["candidates"].astype(np.int32)
    more["candidate_attributes"] = attributes_of(more["candidates"])
    more["retrieval_scores"] = np.concatenate([x["retrieval_scores"], rng.normal(size=(4, 36))], 1)
    more["context"] = np.concatenate([x["context"], rng.integers(1, 25, (4, 6))], 1).astype(np.int32)
    few, many = ranker.attention(x)["context"], ranker.attention(more)["context"]
    counts = [(np.asarray(a) > 0).sum(-1) for a in (few, many)]
    assert counts[0].max() == counts[1].max() == CONTEXT  # never more than N, 4 or 40 candidates
    np.testing.assert_allclose(logits(ranker, more)[:, :4], logits(ranker, x), rtol=1e-5, atol=1e-6)
    # The paper's context (N = 0) is every other candidate: it grows with the list.
    paper: DSTN = make_ranker("dstn", context_size=0)
    assert (np.asarray(paper.attention(more)["context"]) > 0).sum(-1).max() == 39
    with pytest.raises(ValueError, match="'context' input"):
        ranker({k: v for k, v in x.items() if k != "context"})


# --- AFM -----------------------------------------------------------------------------------


def test_afm_matches_numpy() -> None:
    ranker: AFM = make_ranker("afm", retrieval_score=False)
    rng = np.random.default_rng(14)
    for table in (ranker.item_bias.embeddings, ranker.attribute_bias.embeddings):
        table.assign(rng.normal(size=table.shape).astype(np.float32))
    ranker.bias.assign(0.3)
    x = requests(14)
    out = logits(ranker, x)
    items, attributes = np.asarray(ranker.item_tower.table), np.asarray(ranker.attribute_table.embeddings)
    item_bias = np.asarray(ranker.item_bias.embeddings)[:, 0]
    attribute_bias = np.asarray(ranker.attribute_bias.embeddings)[:, 0]
    w, b_w = np.asarray(ranker.attention_hidden.kernel), np.asarray(ranker.attention_hidden.bias)
    h, p = np.asarray(ranker.attention_out.kernel)[:, 0], np.asarray(ranker.projection.kernel)[:, 0]

    def mean_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        ids = ids[ids > 0]
        return table[ids].mean(0) if len(ids) else np.zeros(table.shape[1:], np.float32)

    for b in range(4):
        hist, hist_attrs = x["history"][b], x["history_attributes"][b].ravel()
        for c, cand in enumerate(x["candidates"][b]):
            if cand == 0:
                assert out[b, c] == 0.0
                continue
            cand_attrs = x["candidate_attributes"][b, c]
            fields = [items[cand], mean_rows(attributes, cand_attrs), mean_rows(items, hist)]
            fields.append(mean_rows(attributes, hist_attrs))
            products = np.stack([fields[i] * fields[j] for i, j in combinations(range(4), 2)])  # [6, d]
            scores = np.maximum(products @ w + b_w, 0) @ h
            a = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            linear = 0.3 + item_bias[cand] + mean_rows(attribute_bias, cand_attrs)
            linear += mean_rows(item_bias, hist) + mean_rows(attribute_bias, hist_attrs)
            np.testing.assert_allclose(out[b, c], p @ (a @ products) + linear, rtol=1e-4, atol=1e-6)
    a, _ = ranker.attention(x)
    np.testing.assert_allclose(np.asarray(a).sum(-1), 1.0, atol=1e-5)  # AFM's attention is a softmax


def test_afm_attention_dropout_acts_only_in_training() -> None:
    ranker = make_ranker("afm", attention_dropout=0.5)
    x = requests(15)
    np.testing.assert_array_equal(logits(ranker, x), logits(ranker, x))
    assert not np.allclose(logits(ranker, x, training=True), logits(ranker, x), atol=1e-7)
