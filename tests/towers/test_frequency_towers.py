"""The frequency-domain towers (fmlprec, bsarec): their filters against numpy's FFT, BSARec's
mixing at its ends (α = 0: SASRec; α = 1: the filter alone), side information, what they may be
trained on, and the compiled serving path."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from retrieval.artifacts.model import compiled_tower
from retrieval.training.config import ModelConfig
from retrieval.training.examples import next_item_examples
from retrieval.training.model import TwoTowerModel, build_model, export_user_tower
from tests.helpers import run_tool
from towers import ItemTower, build_user_tower
from towers.frequency import BeyondFilter, LearnableFilter, low_pass

NUM_ITEMS, DIM, MAX_LEN = 30, 8, 10


def make_tower(name: str, **kwargs):
    keras.utils.set_random_seed(0)
    tower = build_user_tower(name, item_tower=ItemTower(NUM_ITEMS + 1, DIM), max_len=MAX_LEN, **kwargs)
    tower.build()
    return tower


def histories(seed: int, batch: int = 4, length: int = MAX_LEN) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((batch, length), np.int32)
    for row in out:
        n = rng.integers(1, length + 1)
        row[length - n :] = rng.integers(1, NUM_ITEMS + 1, n)
    return out


@pytest.mark.parametrize("length", [MAX_LEN, 7])  # even and odd: rfft's last bin differs
def test_learnable_filter_is_numpys_fft_product(length: int) -> None:
    layer = LearnableFilter(length, DIM)
    layer.build()
    x = np.random.default_rng(0).normal(size=(3, length, DIM)).astype(np.float32)
    weight = np.asarray(layer.real) + 1j * np.asarray(layer.imag)  # [length // 2 + 1, d]
    expected = np.fft.irfft(np.fft.rfft(x, axis=1) * weight[None], n=length, axis=1)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=1e-5)


@pytest.mark.parametrize("columns", [1, 4, MAX_LEN])
def test_a_filter_on_fewer_columns_is_the_window_with_zeros_before_them(columns: int) -> None:
    """A batch trimmed to ``T`` columns is filtered as the last ``T`` of the ``length`` window
    (the earlier positions zero): what numpy's FFT gives on the zero-padded window."""
    layer = LearnableFilter(MAX_LEN, DIM)
    layer.build()
    x = np.random.default_rng(7).normal(size=(2, columns, DIM)).astype(np.float32)
    window = np.concatenate([np.zeros((2, MAX_LEN - columns, DIM), np.float32), x], axis=1)
    weight = np.asarray(layer.real) + 1j * np.asarray(layer.imag)
    expected = np.fft.irfft(np.fft.rfft(window, axis=1) * weight[None], n=MAX_LEN, axis=1)
    np.testing.assert_allclose(np.asarray(layer(x)), expected[:, -columns:], atol=1e-5)
    spectrum = np.fft.rfft(window, axis=1)
    spectrum[:, 3:] = 0
    expected = np.fft.irfft(spectrum, MAX_LEN, axis=1)[:, -columns:]
    np.testing.assert_allclose(np.asarray(low_pass(x, 3, MAX_LEN)), expected, atol=1e-5)


def test_low_pass_keeps_the_lowest_frequencies() -> None:
    x = np.random.default_rng(1).normal(size=(2, MAX_LEN, DIM)).astype(np.float32)
    spectrum = np.fft.rfft(x, axis=1)
    spectrum[:, 2:] = 0
    np.testing.assert_allclose(
        np.asarray(low_pass(x, 2, MAX_LEN)), np.fft.irfft(spectrum, MAX_LEN, axis=1), atol=1e-5
    )
    # A constant sequence is all mean: it passes whole. A cosine at frequency 3 does not pass a
    # cut-off of 3 (bins 0, 1, 2) and passes one of 4 whole.
    constant = np.full((1, MAX_LEN, DIM), 2.5, np.float32)
    np.testing.assert_allclose(np.asarray(low_pass(constant, 1, MAX_LEN)), constant, atol=1e-5)
    wave = np.cos(2 * np.pi * 3 * np.arange(MAX_LEN) / MAX_LEN)[None, :, None] * np.ones((1, 1, DIM))
    np.testing.assert_allclose(np.asarray(low_pass(wave.astype(np.float32), 3, MAX_LEN)), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(low_pass(wave.astype(np.float32), 4, MAX_LEN)), wave, atol=1e-5)


def test_beyond_filter_is_low_plus_beta_times_high() -> None:
    layer = BeyondFilter(MAX_LEN, DIM, cutoff=3)
    layer.build()
    x = np.random.default_rng(2).normal(size=(2, MAX_LEN, DIM)).astype(np.float32)
    layer.sqrt_beta.assign(np.ones(DIM, np.float32))  # β = 1: low + high = x
    np.testing.assert_allclose(np.asarray(layer(x)), x, atol=1e-5)
    sqrt_beta = np.linspace(-1.5, 1.5, DIM).astype(np.float32)
    layer.sqrt_beta.assign(sqrt_beta)
    spectrum = np.fft.rfft(x, axis=1)
    spectrum[:, 3:] = 0
    low = np.fft.irfft(spectrum, MAX_LEN, axis=1)
    np.testing.assert_allclose(np.asarray(layer(x)), low + sqrt_beta**2 * (x - low), atol=1e-5)


def test_options_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match=r"filter_cutoff must be in \[1, 6\]"):
        make_tower("bsarec", filter_cutoff=7)
    with pytest.raises(ValueError, match="filter_alpha must be in"):
        make_tower("bsarec", filter_alpha=1.5)
    with pytest.raises(ValueError, match="fmlprec has no attention"):
        make_tower("fmlprec", fusion="nova", side_features={"action": 3})
    make_tower("fmlprec", fusion="sum", side_features={"action": 3})  # invasive fusion is fine


@pytest.mark.parametrize("name", ["fmlprec", "bsarec"])
def test_each_block_zeroes_the_padding_before_its_filter(name: str) -> None:
    """A block's normalisation makes padded positions non-zero (LN(0) is its bias, and a
    trained bias is not 0): whatever is there must not reach the items through the filter."""
    block = make_tower(name).blocks[0]
    norm = block.norm1
    norm.set_weights([w + np.linspace(0.5, 1.5, DIM, dtype=np.float32) for w in norm.get_weights()])
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, MAX_LEN, DIM)).astype(np.float32)
    keep = np.ones((2, MAX_LEN, 1), np.float32)
    keep[:, :4] = 0.0  # four padded positions
    mask = np.tril(np.ones((MAX_LEN, MAX_LEN), bool))[None] & (keep[:, None, :, 0] > 0)
    zeroed = x * keep
    a = np.asarray(block(zeroed, mask, keep=keep))
    b = np.asarray(block(x, mask, keep=keep))  # the padded positions hold anything
    np.testing.assert_allclose(a[:, 4:], b[:, 4:], atol=1e-5)


def copy_shared_weights(source, target) -> None:
    """SASRec's weights into BSARec's tower (the filters' own weights stay as they are)."""
    for name in ("item_tower", "positions", "final_norm"):
        getattr(target, name).set_weights(getattr(source, name).get_weights())
    for a, b in zip(source.blocks, target.blocks, strict=True):
        for name in ("norm1", "norm2", "attention", "ffn_in", "ffn_out"):
            getattr(b, name).set_weights(getattr(a, name).get_weights())


def test_alpha_zero_is_sasrec_and_alpha_one_ignores_the_attention() -> None:
    x = histories(3)
    sasrec = make_tower("sasrec", num_heads=2)
    attention_only = make_tower("bsarec", num_heads=2, filter_alpha=0.0)
    copy_shared_weights(sasrec, attention_only)
    np.testing.assert_allclose(
        np.asarray(attention_only({"items": x})), np.asarray(sasrec({"items": x})), atol=1e-5
    )
    filter_only = make_tower("bsarec", num_heads=2, filter_alpha=1.0)
    before = np.asarray(filter_only({"items": x}))
    for block in filter_only.blocks:
        block.attention.set_weights([w * 3.0 + 0.1 for w in block.attention.get_weights()])
    np.testing.assert_allclose(np.asarray(filter_only({"items": x})), before, atol=1e-5)
    mixed = make_tower("bsarec", num_heads=2, filter_alpha=0.5)  # and in between, both count
    assert np.abs(np.asarray(mixed({"items": x})) - np.asarray(sasrec({"items": x}))).max() > 1e-3


def test_nova_side_information_reaches_bsarec_through_its_attention_only() -> None:
    x = histories(4)
    actions = np.where(x > 0, 1 + np.arange(MAX_LEN) % 3, 0).astype(np.int32)
    flipped = np.where(x > 0, 4 - actions, 0).astype(np.int32)
    for alpha, changes in ((0.5, True), (1.0, False)):
        tower = make_tower("bsarec", fusion="nova", side_features={"action": 3}, filter_alpha=alpha)
        a = np.asarray(tower({"items": x, "action": actions}))
        b = np.asarray(tower({"items": x, "action": flipped}))
        assert (np.abs(a - b).max() > 1e-4) == changes


@pytest.mark.parametrize("name", ["fmlprec", "bsarec"])
def test_an_output_depends_on_its_prefix_alone_while_positions_see_the_future(name: str) -> None:
    """Objective ``last`` gives a tower each prefix as its whole input, so the vector trained to
    predict item t is computed from items < t (checked on the examples it is trained on). The
    filter's positions, though, mix in later items: that is why ``all_positions`` is refused."""
    tower = make_tower(name)
    sequence = np.array([5, 9, 2, 7, 11, 1, 30, 4, 12, 3, 8, 6], np.int32)
    inputs, targets = next_item_examples({"items": [sequence]}, MAX_LEN)
    for row, target in zip(inputs["items"], targets, strict=True):
        t = int(np.flatnonzero(sequence == target)[0])  # the targets are distinct here
        prefix = sequence[max(0, t - MAX_LEN) : t]
        np.testing.assert_array_equal(row[row > 0], prefix)
    out = np.asarray(tower({"items": inputs["items"]}))
    for i, row in enumerate(inputs["items"]):
        alone = np.asarray(tower({"items": row[row > 0][None, :]}))  # the prefix, no padding
        np.testing.assert_allclose(out[i], alone[0], atol=1e-5)
    full = sequence[-MAX_LEN:][None, :]
    changed = full.copy()
    changed[0, 6:] = 1  # every item after position 5
    a, b = (np.asarray(tower.sequence_output({"items": s})) for s in (full, changed))
    assert np.abs(a[0, :6] - b[0, :6]).max() > 1e-4  # earlier positions see the change


@pytest.mark.parametrize("name", ["fmlprec", "bsarec"])
def test_all_positions_is_refused(name: str, synthetic_csv, tmp_path, capsys) -> None:
    model = build_model(ModelConfig(tower=name, dim=DIM, max_len=MAX_LEN), NUM_ITEMS + 1)
    assert model.objective == "last"
    with pytest.raises(ValueError, match=r"trains with \('last',\), not 'all_positions'"):
        model.set_objective("all_positions")
    code = run_tool(
        "train", "--data", str(synthetic_csv), "--model", name, "--out", str(tmp_path / "m"),
        "--set", "train.objective=all_positions", "--quiet",
    )  # fmt: skip
    assert code == 2
    assert "not 'all_positions'" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_the_exported_bsarec_compiles_with_xla(tmp_path, caplog) -> None:
    model = TwoTowerModel(make_tower("bsarec", num_heads=2))
    x = histories(5, batch=3, length=6)
    expected = np.asarray(model({"items": x}))
    export_user_tower(model, tmp_path / "user_tower")
    exported = tf.saved_model.load(str(tmp_path / "user_tower"))
    table = tf.constant(np.load(tmp_path / "user_tower" / "item_vectors.npy"))
    with caplog.at_level(logging.WARNING):
        got = compiled_tower(exported, table)({"items": x})
    assert "XLA cannot compile" not in caplog.text
    np.testing.assert_allclose(got, expected, atol=1e-5)
