"""Mixing positions in the frequency domain (FMLP-Rec, BSARec): filters along the sequence axis
and the transformer tower they run in.

A filter multiplies the real FFT over ``max_len`` positions by a spectrum: a circular
convolution of the sequence with the spectrum's kernel, so position t is mixed with later
positions too. The towers built on it therefore train only on the newest position of each
prefix (objective ``last``) and never on ``all_positions``, where a position would see the
items it has to predict.

Inputs are left-padded and the padded positions are zeroed before every filter, so a batch of
``T <= max_len`` columns is the last ``T`` of a ``max_len`` window whose other positions are
zero: the filter is the ``[T, T]`` corner of the ``max_len`` circulant matrix, applied
directly. Padding never changes the output, and a batch trimmed to its longest sequence
(``train.length_buckets``) costs ``T²``, not ``max_len`` FFTs.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from towers.saving import ConstructorConfig
from towers.transformer import TransformerTower


def circulant_corner(kernel: Any, columns: Any, length: int) -> Any:
    """``M[i, j] = kernel[(i − j) mod length]`` for ``i, j < columns``: the last ``columns`` rows
    and columns of the circular convolution with ``kernel`` ``[length, ...]`` -> ``[T, T, ...]``."""
    index = ops.arange(columns)
    return ops.take(kernel, ops.mod(index[:, None] - index[None, :] + length, length), axis=0)


def frequency_filter(x: Any, real: Any, imag: Any, length: int) -> Any:
    """``irfft(rfft(x) * (real + i imag))`` over a ``length`` window whose first positions, before
    ``x``'s ``T`` columns, are zero.

    Args:
        x: ``[B, T, d]``, ``T <= length``.
        real, imag: the spectrum ``[length // 2 + 1, d]``.

    Returns:
        ``[B, T, d]``.
    """
    kernel = ops.transpose(ops.irfft((ops.transpose(real), ops.transpose(imag)), fft_length=length))
    corner = circulant_corner(kernel, ops.shape(x)[1], length)  # [T, T, d]
    return ops.einsum("tsd,bsd->btd", corner, x)


def low_pass_kernel(cutoff: int, length: int) -> np.ndarray:
    """The kernel ``[length]`` of the filter keeping the ``cutoff`` lowest rFFT frequencies."""
    keep = (np.arange(length // 2 + 1) < cutoff).astype(np.float64)
    return np.fft.irfft(keep, n=length).astype(np.float32)


def low_pass(x: Any, cutoff: int, length: int) -> Any:
    """``x`` ``[B, T, d]`` with only its ``cutoff`` lowest frequencies (the mean included) over a
    ``length`` window, zero before ``x``'s columns."""
    corner = circulant_corner(low_pass_kernel(cutoff, length), ops.shape(x)[1], length)  # [T, T]
    return ops.einsum("ts,bsd->btd", corner, x)


@keras.saving.register_keras_serializable(package="towers")
class LearnableFilter(ConstructorConfig, keras.layers.Layer):
    """FMLP-Rec's filter layer: a learned complex spectrum per dimension.

    Call:
        x: ``[B, T, d]``, ``T <= length``, the last ``T`` positions of a window whose earlier
            positions are zero -> ``[B, T, d]``.
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


@keras.saving.register_keras_serializable(package="towers")
class BeyondFilter(ConstructorConfig, keras.layers.Layer):
    """BSARec's inductive bias: ``low + β ⊙ (x − low)``, ``low`` the ``cutoff`` lowest frequencies
    of ``x`` and ``β = sqrt_beta²`` a learned scale per dimension (the high frequencies rescaled).

    Call:
        x: ``[B, T, d]``, ``T <= length``, the last ``T`` positions of a window whose earlier
            positions are zero -> ``[B, T, d]``.
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


class FrequencyTower(TransformerTower):
    """A causal transformer tower whose blocks (:meth:`make_block`) filter over ``max_len``
    positions; the newest position's output is the user (K = 1), trained by objective ``last``.
    """

    causal = True
    objectives = ("last",)

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.sequence_output(inputs, training=training)[:, -1:, :]  # [B, 1, d]
