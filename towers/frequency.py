"""Mixing positions in the frequency domain (FMLP-Rec, BSARec): filters along the sequence axis
and the transformer tower they run in.

A filter multiplies the sequence's real FFT by a spectrum, i.e. a circular convolution over
all positions: position t is mixed with later positions too. The towers built on it therefore
train only on the newest position of each prefix (objective ``last``) and never on
``all_positions``, where a position would see the items it has to predict.

The FFT always spans ``max_len`` positions (the length of the learned spectra): inputs are
left-padded to it, and the padded positions are zeroed before every filter so that padding
never changes the output.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from towers.transformer import TransformerTower


def _along_sequence(x: Any) -> Any:
    """``[B, L, d]`` <-> ``[B, d, L]``: Keras' FFTs run over the last axis."""
    return ops.transpose(x, (0, 2, 1))


def frequency_filter(x: Any, real: Any, imag: Any, length: int) -> Any:
    """``irfft(rfft(x) * (real + i imag))`` along the sequence axis.

    Args:
        x: ``[B, length, d]``.
        real, imag: the spectrum ``[length // 2 + 1, d]`` (or broadcastable to it).

    Returns:
        ``[B, length, d]``.
    """
    re, im = ops.rfft(_along_sequence(x), fft_length=length)  # [B, d, F] each
    w_re, w_im = ops.transpose(real), ops.transpose(imag)  # [d, F]
    mixed = ops.irfft((re * w_re - im * w_im, re * w_im + im * w_re), fft_length=length)
    return _along_sequence(mixed)


def low_pass(x: Any, cutoff: int, length: int) -> Any:
    """``x`` ``[B, length, d]`` with only its ``cutoff`` lowest frequencies (the mean included)."""
    keep = ops.cast(ops.arange(length // 2 + 1) < cutoff, "float32")[:, None]  # [F, 1]
    return frequency_filter(x, keep, ops.zeros_like(keep), length)


@keras.saving.register_keras_serializable(package="towers")
class LearnableFilter(keras.layers.Layer):
    """FMLP-Rec's filter layer: a learned complex spectrum per dimension.

    Call:
        x: ``[B, length, d]`` -> ``[B, length, d]``.
    """

    def __init__(self, length: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length, self.dim = length, dim

    def build(self, input_shape: Any = None) -> None:
        shape, init = (self.length // 2 + 1, self.dim), keras.initializers.RandomNormal(stddev=0.02)
        self.real = self.add_weight(shape=shape, initializer=init, name="real")
        self.imag = self.add_weight(shape=shape, initializer=init, name="imag")
        self.built = True

    def call(self, x: Any) -> Any:
        return frequency_filter(x, self.real, self.imag, self.length)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "length": self.length, "dim": self.dim}


@keras.saving.register_keras_serializable(package="towers")
class BeyondFilter(keras.layers.Layer):
    """BSARec's inductive bias: ``low + β ⊙ (x − low)``, ``low`` the ``cutoff`` lowest frequencies
    of ``x`` and ``β = sqrt_beta²`` a learned scale per dimension (the high frequencies rescaled).

    Call:
        x: ``[B, length, d]`` -> ``[B, length, d]``.
    """

    def __init__(self, length: int, dim: int, cutoff: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 1 <= cutoff <= length // 2 + 1:
            raise ValueError(
                f"filter_cutoff must be in [1, {length // 2 + 1}] (length {length}), got {cutoff}"
            )
        self.length, self.dim, self.cutoff = length, dim, cutoff

    def build(self, input_shape: Any = None) -> None:
        self.sqrt_beta = self.add_weight(
            shape=(self.dim,), initializer=keras.initializers.RandomNormal(stddev=1.0), name="sqrt_beta"
        )
        self.built = True

    def call(self, x: Any) -> Any:
        low = low_pass(x, self.cutoff, self.length)
        return low + ops.square(self.sqrt_beta) * (x - low)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "length": self.length, "dim": self.dim, "cutoff": self.cutoff}


def left_pad(inputs: dict[str, Any], length: int) -> dict[str, Any]:
    """Every ``[B, L]`` input left-padded with 0 to ``[B, length]`` (``L <= length``)."""
    out = {}
    for name, value in inputs.items():
        value = ops.convert_to_tensor(value)
        padding = ops.zeros((ops.shape(value)[0], length - ops.shape(value)[1]), dtype=value.dtype)
        out[name] = ops.concatenate([padding, value], axis=1)
    return out


class FrequencyTower(TransformerTower):
    """A causal transformer tower whose blocks (:meth:`make_block`) filter over ``max_len``
    positions; the newest position's output is the user (K = 1), trained by objective ``last``.

    Inputs shorter than ``max_len`` are left-padded to it; outputs and attention maps are cut
    back to the input's columns.
    """

    causal = True
    objectives = ("last",)

    def encode(self, inputs: dict[str, Any], training: bool = False) -> tuple[Any, list[Any]]:
        length = ops.shape(inputs["items"])[1]
        x, attention = super().encode(left_pad(inputs, self.max_len), training=training)
        return x[:, -length:], [None if a is None else a[:, :, -length:, -length:] for a in attention]

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.sequence_output(inputs, training=training)[:, -1:, :]  # [B, 1, d]
