"""User towers: shapes, padding invariance, causality, reference computations, serialization."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from retrieval.training.config import ModelConfig
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import SampledSoftmaxTask
from retrieval.training.model import TwoTowerModel, build_model, export_user_tower
from tests.helpers import compile_for_fit, saved_endpoint, tiered
from towers import ItemTower, build_user_tower, tower_names

NUM_ITEMS, DIM, MAX_LEN = 40, 16, 12
# Per-tower arguments, all of them ModelConfig fields (so build_model takes them too); towers
# missing here are tested with their defaults.
KWARGS = {
    "sa": {"num_interests": 3},
    "sasrec": {"num_blocks": 2, "num_heads": 2, "dropout": 0.1},
    "youtubednn": {},
    "dr": {"num_interests": 3},
    "mind": {"num_interests": 3},
    "din": {"num_interests": 3},
    "fmlprec": {"num_blocks": 2, "dropout": 0.1},
    "bsarec": {"num_blocks": 2, "num_heads": 2, "dropout": 0.1, "filter_alpha": 0.5, "filter_cutoff": 2},
}
# Towers whose attention maps are checked for shape and zero weight on padding.
ATTENTION_MAPS = {"sa": "interests", "dr": "routing", "mind": "routing", "din": "activation"}


def make_tower(name: str):
    keras.utils.set_random_seed(0)
    tower = build_user_tower(
        name, item_tower=ItemTower(NUM_ITEMS + 1, DIM), max_len=MAX_LEN, **KWARGS.get(name, {})
    )
    tower.build()
    return tower


def expected_interests(name: str, tower) -> int:
    return KWARGS[name].get("num_interests", 1) if name in KWARGS else tower.num_interests


def histories(rng: np.random.Generator, batch: int = 4, length: int = MAX_LEN) -> np.ndarray:
    """Left-padded random histories of varying length (at least one item each)."""
    out = np.zeros((batch, length), np.int32)
    for row in out:
        n = rng.integers(1, length + 1)
        row[length - n :] = rng.integers(1, NUM_ITEMS + 1, n)
    return out


def test_registry_has_the_slice_towers_and_rejects_unknown() -> None:
    assert {"sa", "sasrec", "youtubednn", "dr", "mind", "din"} <= set(tower_names())
    with pytest.raises(ValueError, match="unknown user tower 'nope'"):
        build_user_tower("nope", item_tower=ItemTower(3, 4), max_len=2)


@pytest.mark.parametrize("name", tower_names())
def test_output_shape_is_batch_k_d(name: str) -> None:
    tower = make_tower(name)
    out = tower({"items": histories(np.random.default_rng(0))})
    assert tuple(out.shape) == (4, tower.num_interests, DIM)
    assert tower.num_interests == expected_interests(name, tower)


@pytest.mark.parametrize("name", tower_names())
def test_padding_does_not_change_the_output(name: str) -> None:
    tower = make_tower(name)
    x = histories(np.random.default_rng(1), length=6)
    wider = np.concatenate([np.zeros((len(x), MAX_LEN - 6), np.int32), x], axis=1)
    np.testing.assert_allclose(
        np.asarray(tower({"items": x})), np.asarray(tower({"items": wider})), atol=1e-5
    )
    # The padding row's embedding must not leak in either: change it and compare.
    before = np.asarray(tower({"items": x}))
    table = tower.item_tower.table
    table.assign(np.concatenate([np.full((1, DIM), 5.0, np.float32), np.asarray(table)[1:]]))
    np.testing.assert_allclose(np.asarray(tower({"items": x})), before, atol=1e-5)


def test_sasrec_does_not_see_the_future() -> None:
    tower = make_tower("sasrec")
    x = np.arange(1, MAX_LEN + 1, dtype=np.int32)[None, :]
    changed = x.copy()
    changed[0, 7:] = NUM_ITEMS  # alter every item after position 6
    a = np.asarray(tower.sequence_output({"items": x}))
    b = np.asarray(tower.sequence_output({"items": changed}))
    np.testing.assert_allclose(a[0, :7], b[0, :7], atol=1e-5)
    assert np.abs(a[0, 7:] - b[0, 7:]).max() > 1e-3  # and the later positions do change


def test_sa_matches_a_numpy_reference() -> None:
    tower = make_tower("sa")
    x = histories(np.random.default_rng(2))
    out = np.asarray(tower({"items": x}))
    table = np.asarray(tower.item_tower.table)
    pos = np.asarray(tower.positions.table.embeddings)
    w1, b1 = (np.asarray(w) for w in tower.w1.weights)
    (w2,) = (np.asarray(w) for w in tower.w2.weights)
    for b, row in enumerate(x):
        items = row[row > 0]
        n = len(items)
        h = table[items]  # [n, d]
        hp = h + pos[np.arange(n)[::-1]]  # recency positions: newest = 0
        logits = (np.tanh(hp @ w1 + b1) @ w2).T  # [K, n]
        a = np.exp(logits - logits.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(out[b], a @ h, rtol=1e-4, atol=1e-5)


def test_sa_attention_is_a_distribution_over_real_items() -> None:
    tower = make_tower("sa")
    x = histories(np.random.default_rng(3))
    a, _ = tower.attention({"items": x})
    a = np.asarray(a)
    np.testing.assert_allclose(a.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(a[np.broadcast_to((x == 0)[:, None, :], a.shape)] == 0.0)


@pytest.mark.parametrize("name", tower_names())
def test_config_round_trip_gives_identical_outputs(name: str) -> None:
    tower = make_tower(name)
    x = histories(np.random.default_rng(4))
    expected = np.asarray(tower({"items": x}))
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(tower))
    assert clone.built  # build_config in the serialized form rebuilds the weights
    assert clone.get_config() == tower.get_config()
    clone.set_weights(tower.get_weights())
    np.testing.assert_allclose(np.asarray(clone({"items": x})), expected, atol=1e-6)


@pytest.mark.parametrize("name", tower_names())
def test_keras_file_round_trip(name: str, tmp_path) -> None:
    model = TwoTowerModel(make_tower(name))
    x = histories(np.random.default_rng(5))
    expected = np.asarray(model({"items": x}))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(np.asarray(loaded({"items": x})), expected, atol=1e-6)
    # The item tower stays shared with the user tower after loading.
    assert loaded.item_tower is loaded.user_tower.item_tower


def test_build_model_passes_the_config_fields_each_tower_accepts() -> None:
    from retrieval.training.config import ModelConfig
    from retrieval.training.model import build_model

    sasrec = build_model(ModelConfig(tower="sasrec", dim=8, num_blocks=3, num_heads=2, dropout=0.0), 20)
    assert (len(sasrec.user_tower.blocks), sasrec.user_tower.num_heads) == (3, 2)
    sa = build_model(ModelConfig(tower="sa", dim=8, num_interests=2, num_blocks=3), 20)  # num_blocks unused
    assert sa.user_tower.num_interests == 2
    assert build_model(ModelConfig(tower="sa", dim=8), 20).user_tower.num_interests == 4  # tower default
    with pytest.raises(ValueError, match="single-interest"):
        build_model(ModelConfig(tower="sasrec", dim=8, num_interests=4), 20)
    bsarec = build_model(
        ModelConfig(tower="bsarec", dim=8, num_blocks=3, filter_alpha=0.25, filter_cutoff=2), 20
    )
    assert [(b.alpha, b.beyond.cutoff) for b in bsarec.user_tower.blocks] == [(0.25, 2)] * 3
    fmlprec = build_model(ModelConfig(tower="fmlprec", dim=8, max_len=7, num_blocks=1), 20)
    assert [b.filter.length for b in fmlprec.user_tower.blocks] == [7]


def learnable_examples(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Histories walking through one of 4 clusters of 10 items in order; the target is the next step."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, MAX_LEN), np.int32)
    y = np.zeros(n, np.int32)
    for row in range(n):
        cluster, start, length = rng.integers(4), rng.integers(10), rng.integers(2, MAX_LEN + 1)
        walk = cluster * 10 + (start + np.arange(length + 1)) % 10 + 1
        x[row, MAX_LEN - length :], y[row] = walk[:-1], walk[-1]
    return x, y


def full_softmax_task() -> SampledSoftmaxTask:
    """The task with every item as a negative, so that the loss is deterministic."""
    sampler = CandidateSampler.from_counts(np.ones(NUM_ITEMS + 1), "uniform")
    task = SampledSoftmaxTask(sampler, num_negatives=NUM_ITEMS)
    every_item = tf.range(1, NUM_ITEMS + 1, dtype=tf.int32)
    task.sampler.sample = lambda n: every_item  # type: ignore[method-assign]
    return task


@pytest.mark.parametrize(
    "name", tiered(tower_names(), slow={"bert4rec", "sasrec", "din", "dr", "mind", "fmlprec", "bsarec"})
)  # 1-2 s of CPU each, the transformers 3-4 s
def test_a_few_training_steps_reduce_the_loss(name: str) -> None:
    keras.utils.set_random_seed(0)
    config = dataclasses.replace(ModelConfig(tower=name, dim=DIM, max_len=MAX_LEN), **KWARGS.get(name, {}))
    model = build_model(config, NUM_ITEMS + 1)
    model.task = full_softmax_task()
    compile_for_fit(model, 0.01)
    x, y = learnable_examples()

    def loss() -> float:
        return float(model.task(model({"items": x}, training=False), y, model.item_tower))

    before = loss()
    model.fit({"items": x}, y, batch_size=32, epochs=8, shuffle=False, verbose=0)  # 24 steps
    assert loss() < 0.9 * before  # 0.47 (bsarec) to 0.80 (mind)


Exported = Callable[[str], tuple[TwoTowerModel, Path]]


@pytest.fixture(scope="module")
def exported_towers(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """``name`` -> the two-tower model of :func:`make_tower`'s tower and its exported user tower
    folder, built and exported once per module (an export traces every endpoint: 1-4 s); the
    tests only read them."""
    built: dict[str, tuple[TwoTowerModel, Path]] = {}

    def get(name: str) -> tuple[TwoTowerModel, Path]:
        if name not in built:
            model = TwoTowerModel(make_tower(name))
            model({"items": histories(np.random.default_rng(2))})
            folder = tmp_path_factory.mktemp(name) / "user_tower"
            export_user_tower(model, folder)
            built[name] = (model, folder)
        return built[name]

    return get


@pytest.mark.parametrize("name", ["sa", "sasrec"])
def test_export_stores_each_weight_once_and_no_item_table(name: str, exported_towers: Exported) -> None:
    # Keras' ExportArchive.track() saved every weight twice (keras-team/keras#23553): twice
    # the artifact, and twice the variables in every process that loads it.
    model, folder = exported_towers(name)
    reader = tf.train.load_checkpoint(str(folder / "variables" / "variables"))
    shapes = reader.get_variable_to_shape_map().values()
    stored = sum(int(np.prod(shape)) for shape in shapes)
    # The item table is not among them: the endpoints read the item_vectors given with the call.
    table = model.item_tower.table.shape
    assert list(table) not in shapes
    weights = sum(int(np.prod(w.shape)) for w in model.user_tower.weights) - int(np.prod(table))
    assert weights <= stored < weights + 8  # + TensorFlow's own scalars (the save counter)


@pytest.mark.parametrize("name", tiered(tower_names(), slow={"bert4rec", "sasrec", "mind", "din", "bsarec"}))
def test_exported_user_tower_gives_the_keras_vectors(name: str, exported_towers: Exported) -> None:
    model, folder = exported_towers(name)
    x = histories(np.random.default_rng(6))
    expected = np.asarray(model({"items": x}))
    exported = saved_endpoint(folder)
    np.testing.assert_allclose(exported({"items": x}), expected, atol=1e-5)
    # Another input length goes through the same endpoint (traced for any L).
    short = x[:, -5:]
    np.testing.assert_allclose(
        exported({"items": short}),
        np.asarray(model({"items": short})),
        atol=1e-5,
    )


@pytest.mark.parametrize("name", tower_names())
def test_attention_maps_cover_the_history(name: str) -> None:
    tower = make_tower(name)
    x = histories(np.random.default_rng(7))
    maps = {key: np.asarray(value) for key, value in tower.attention_maps({"items": x}).items()}
    for value in maps.values():
        assert value.ndim == 3 and value.shape[0] == len(x) and value.shape[2] == x.shape[1]
    if name in ATTENTION_MAPS:
        (key,) = maps
        assert key == ATTENTION_MAPS[name]
        assert maps[key].shape == (len(x), tower.num_interests, x.shape[1])
        padded = np.broadcast_to((x == 0)[:, None, :], maps[key].shape)
        assert np.all(maps[key][padded] == 0.0) and np.abs(maps[key][~padded]).max() > 0


def oracle_interest_weights(name: str, tower, x: np.ndarray) -> np.ndarray:
    """Per-interest weights ``[B, K, L]`` read off :meth:`attention_maps`: the one map, or (the
    transformers) the last block's heads averaged; BERT4Rec's maps end with the appended mask
    token's column and, for an input of ``max_len`` events, start at its second event."""
    maps = {key: np.asarray(value) for key, value in tower.attention_maps({"items": x}).items()}
    if len(maps) == 1:
        return next(iter(maps.values()))
    last = maps[f"block{len(maps) - 1}"].mean(axis=1, keepdims=True)  # [B, 1, L']
    if name != "bert4rec":
        return last
    out = np.zeros((len(x), 1, x.shape[1]), np.float32)
    read = last[:, :, :-1]  # without the mask token's column
    out[:, :, x.shape[1] - read.shape[2] :] = read
    return out


@pytest.mark.parametrize(
    "name", tiered(tower_names(), slow={"sasrec", "bert4rec", "din", "mind", "bsarec"})
)  # 2-4 s each
def test_interest_weights_explain_the_interests(name: str, exported_towers: Exported) -> None:
    model, folder = exported_towers(name)
    tower = model.user_tower
    x = histories(np.random.default_rng(8))
    if tower.explanation == "none":
        with pytest.raises(ValueError, match="no per-interest weights"):
            tower.interest_weights({"items": x})
        return
    got = np.asarray(tower.interest_weights({"items": x}))
    assert got.shape == (len(x), tower.num_interests, x.shape[1])
    np.testing.assert_allclose(got, oracle_interest_weights(name, tower, x), atol=1e-6)
    assert np.all(got[np.broadcast_to((x == 0)[:, None, :], got.shape)] == 0.0)  # padding weighs 0
    # More padding columns change nothing (the served histories are padded to one width).
    short = histories(np.random.default_rng(9), length=MAX_LEN - 4)
    wide = np.pad(short, ((0, 0), (4, 0)))
    np.testing.assert_allclose(
        np.asarray(tower.interest_weights({"items": wide}))[:, :, 4:],
        np.asarray(tower.interest_weights({"items": short})),
        atol=1e-5,
    )
    # The exported endpoint computes the same weights.
    exported = saved_endpoint(folder, "interest_weights")
    np.testing.assert_allclose(exported({"items": x}), got, atol=1e-5)
