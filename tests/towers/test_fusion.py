"""Side information: NOVA's non-invasive attention, the invasive baselines, item attributes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tests.helpers import tiered
from towers import ItemTower, build_user_tower
from towers.side import FUSIONS, InvasiveFusion, SideEmbedding
from towers.transformer import TransformerBlock

DIM, HEADS, L = 16, 2, 5


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_nova_attention_mixes_item_only_values_with_side_chosen_weights() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    block = TransformerBlock(DIM, HEADS)
    x = rng.normal(size=(2, L, DIM)).astype(np.float32)
    side = rng.normal(size=(2, L, DIM)).astype(np.float32)
    mask = np.ones((2, L, L), bool)
    y, scores = block(x, mask, side=side, return_attention=True)

    # Reference: queries and keys from LN(x + side), values from LN(x) alone.
    mha = block.attention
    wq, bq = (np.asarray(w) for w in mha._query_dense.weights)
    wk, bk = (np.asarray(w) for w in mha._key_dense.weights)
    wv, bv = (np.asarray(w) for w in mha._value_dense.weights)
    wo, bo = (np.asarray(w) for w in mha._output_dense.weights)
    gamma, beta = (np.asarray(w) for w in block.norm1.weights)

    def layer_norm(z: np.ndarray) -> np.ndarray:
        return (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-6) * gamma + beta

    h, fused = layer_norm(x), layer_norm(x + side)
    q = np.einsum("bld,dhk->bhlk", fused, wq) + bq[None, :, None, :]
    k = np.einsum("bld,dhk->bhlk", fused, wk) + bk[None, :, None, :]
    v = np.einsum("bld,dhk->bhlk", h, wv) + bv[None, :, None, :]
    a = softmax(np.einsum("bhqk,bhsk->bhqs", q, k) / np.sqrt(DIM // HEADS))
    np.testing.assert_allclose(np.asarray(scores), a, atol=1e-5)
    attended = np.einsum("bhqs,bhsk->bqhk", a, v)
    after_attention = x + np.einsum("bqhk,hkd->bqd", attended, wo) + bo
    ffn = np.asarray(block.ffn_out(block.ffn_in(block.norm2(after_attention))))
    np.testing.assert_allclose(np.asarray(y), after_attention + ffn, atol=1e-4)

    # Other side features: other attention weights, but the values are the same item-only vectors.
    _, other_scores = block(x, mask, side=side[::-1], return_attention=True)
    assert np.abs(np.asarray(other_scores) - a).max() > 1e-3


def test_invasive_fusion_matches_its_formulas() -> None:
    rng = np.random.default_rng(1)
    h, s = rng.normal(size=(2, L, DIM)).astype(np.float32), rng.normal(size=(2, L, DIM)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(InvasiveFusion("sum", DIM)(h, s)), h + s, atol=1e-6)
    gated = InvasiveFusion("gated", DIM)
    out = np.asarray(gated(h, s))
    w, b = (np.asarray(v) for v in gated.dense.weights)
    g = 1 / (1 + np.exp(-(np.concatenate([h, s], -1) @ w + b)))
    np.testing.assert_allclose(out, g * h + (1 - g) * s, atol=1e-5)
    concat = InvasiveFusion("concat", DIM)
    out = np.asarray(concat(h, s))
    w, b = (np.asarray(v) for v in concat.dense.weights)
    np.testing.assert_allclose(out, np.concatenate([h, s], -1) @ w + b, atol=1e-5)
    with pytest.raises(ValueError, match="invasive fusion"):
        InvasiveFusion("nova", DIM)


def test_side_embedding_ignores_padding_and_unknown_values() -> None:
    layer = SideEmbedding(DIM, {"action": 3, "gap_prev": 4})
    inputs = {
        "items": np.array([[0, 5, 6]]),
        "action": np.array([[0, 0, 2]]),
        "gap_prev": np.array([[0, 1, 3]]),
    }
    out = np.asarray(layer(inputs))
    np.testing.assert_array_equal(out[0, 0], 0.0)
    action, gap = (np.asarray(layer.tables[n].embeddings) for n in ("action", "gap_prev"))
    np.testing.assert_allclose(out[0, 1], gap[1], atol=1e-6)
    np.testing.assert_allclose(out[0, 2], action[2] + gap[3], atol=1e-6)
    with pytest.raises(ValueError, match="unknown side features"):
        SideEmbedding(DIM, {"weather": 3})


def test_item_tower_adds_the_mean_of_its_attributes() -> None:
    tower = ItemTower(6, DIM, num_attributes=4, max_attributes=3)
    tower.build()
    table = np.zeros((6, 3), np.int32)
    table[2] = [1, 3, 0]
    tower.set_item_attributes(table)
    ids = np.array([2, 4])
    out = np.asarray(tower(ids))
    ids_only = np.asarray(tower.id_embedding(ids))
    attributes = np.asarray(tower.attribute_embedding.embeddings)
    np.testing.assert_allclose(out[0], ids_only[0] + (attributes[1] + attributes[3]) / 2, atol=1e-6)
    np.testing.assert_allclose(out[1], ids_only[1], atol=1e-6)  # no attributes: id embedding alone
    with pytest.raises(ValueError, match="attribute table has shape"):
        tower.set_item_attributes(np.zeros((6, 2), np.int32))


def side_tower(name: str, fusion: str):
    keras.utils.set_random_seed(0)
    item_tower = ItemTower(30, DIM, num_attributes=4, max_attributes=2)
    item_tower.build()
    item_tower.set_item_attributes(np.random.default_rng(0).integers(0, 5, (30, 2)))
    return build_user_tower(
        name, item_tower=item_tower, max_len=10, fusion=fusion, side_features={"action": 3}
    )


def inputs_for(rng: np.random.Generator, length: int = 6) -> dict[str, np.ndarray]:
    items = np.array([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], np.int32)[:, -length:]
    return {"items": items, "action": (rng.integers(1, 4, items.shape) * (items > 0)).astype(np.int32)}


@pytest.mark.parametrize("name", tiered(["sasrec", "bert4rec", "sa"], slow={"bert4rec"}))
@pytest.mark.parametrize("fusion", [f for f in FUSIONS if f != "none"])
def test_fusion_towers_pad_invariantly_and_round_trip(name: str, fusion: str) -> None:
    tower = side_tower(name, fusion)
    x = inputs_for(np.random.default_rng(2))
    out = np.asarray(tower(x))
    wider = {k: np.pad(v, ((0, 0), (4, 0))) for k, v in x.items()}
    np.testing.assert_allclose(np.asarray(tower(wider)), out, atol=1e-5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(tower))
    clone.set_weights(tower.get_weights())
    np.testing.assert_allclose(np.asarray(clone(x)), out, atol=1e-6)
    # Side information changes the output.
    flipped = dict(x, action=np.where(x["items"] > 0, 4 - x["action"], 0).astype(np.int32))
    assert np.abs(np.asarray(tower(flipped)) - out).max() > 1e-4


def test_fusion_needs_side_information_and_vice_versa() -> None:
    with pytest.raises(ValueError, match="side information needs a fusion mode"):
        build_user_tower(
            "sasrec", item_tower=ItemTower(10, DIM), max_len=5, fusion="none", side_features={"action": 2}
        )
    with pytest.raises(ValueError, match="a fusion mode needs side"):
        build_user_tower("sasrec", item_tower=ItemTower(10, DIM), max_len=5, fusion="nova")
    with pytest.raises(ValueError, match="unknown fusion"):
        build_user_tower("sasrec", item_tower=ItemTower(10, DIM), max_len=5, fusion="blend")


def test_sa_with_nova_keeps_interests_in_the_span_of_item_embeddings() -> None:
    """NOVA in ComiRec-SA: side information moves the attention, the interests stay A · H_items,
    H the item tower's vectors (id and attributes), the ones the targets are scored against."""
    tower = side_tower("sa", "nova")
    x = inputs_for(np.random.default_rng(3))
    interests = np.asarray(tower(x))
    a, h = tower.attention(x)
    np.testing.assert_allclose(np.asarray(h), np.asarray(tower.item_tower(x["items"])), atol=1e-6)
    assert np.abs(np.asarray(h) - np.asarray(tower.item_tower.id_embedding(x["items"]))).max() > 1e-4
    invasive_values = side_tower("sa", "sum").side_info.items(x["items"], tower.item_tower)
    np.testing.assert_allclose(
        np.asarray(invasive_values), np.asarray(tower.item_tower.id_embedding(x["items"])), atol=1e-6
    )
    np.testing.assert_allclose(interests, np.asarray(a) @ np.asarray(h), atol=1e-5)
    flipped = dict(x, action=np.where(x["items"] > 0, 4 - x["action"], 0).astype(np.int32))
    assert np.abs(np.asarray(tower.attention(flipped)[0]) - np.asarray(a)).max() > 1e-4


def test_towers_taking_side_information_are_the_ones_build_model_accepts_it_for() -> None:
    from retrieval.training.config import ModelConfig
    from retrieval.training.model import build_model, takes_side_information
    from towers import tower_names

    assert [t for t in tower_names() if takes_side_information(t)] == [
        "bert4rec",
        "bsarec",
        "fmlprec",
        "sa",
        "sasrec",
    ]
    with pytest.raises(ValueError, match="'youtubednn' does not take side information"):
        build_model(ModelConfig(tower="youtubednn", dim=8, max_len=5, fusion="sum"), 10)
