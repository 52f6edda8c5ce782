"""Layers shared by the rankers: Dice, the click MLP, DIN's activation unit, the AUGRU cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from towers.din import activation_first_layer
from towers.saving import ConstructorConfig

ACTIVATIONS = ("dice", "prelu", "relu")
"""Hidden activations of :class:`ClickMLP`."""


def masked_mean(x: Any, valid: Any) -> Any:
    """Mean over the valid rows: ``x [..., N, d]``, ``valid [..., N]`` -> ``[..., d]`` (0 if none)."""
    w = ops.expand_dims(ops.cast(valid, x.dtype), -1)  # [..., N, 1]
    return ops.sum(x * w, axis=-2) / ops.maximum(ops.sum(w, axis=-2), 1.0)


def masked_softmax(scores: Any, valid: Any, axis: int = -1) -> Any:
    """Softmax over the valid entries along ``axis``; all zeros where none is valid (no NaN)."""
    valid = ops.cast(valid, "bool")
    scores = ops.where(valid, scores, -1e9)
    e = ops.exp(scores - ops.max(scores, axis=axis, keepdims=True)) * ops.cast(valid, scores.dtype)
    return e / ops.maximum(ops.sum(e, axis=axis, keepdims=True), 1e-12)


def mini_batch_aware_l2(table: Any, ids: Any) -> Any:
    """DIN's mini-batch-aware L2: ``Σ_j ‖w_j‖² / n_j`` over the distinct non-zero ids ``j`` of the batch.

    ``n_j`` is how often ``j`` occurs in ``ids``. Only the rows of the batch are penalised, and
    frequent ids less per occurrence, so the cost does not grow with the catalogue.

    Args:
        table: embedding table ``[V, d]``.
        ids: int ``[...]`` every id of the batch (0 = padding, ignored).

    Returns:
        Scalar penalty (without the ``λ`` factor).
    """
    flat = ops.reshape(ops.cast(ids, "int32"), (-1,))  # [n]
    counts = ops.cast(ops.bincount(flat, minlength=ops.shape(table)[0]), "float32")  # [V]
    n = ops.take(counts, flat)  # [n]: each occurrence's id frequency
    valid = ops.cast(flat > 0, "float32")
    # Summing ‖w_j‖² / n_j² over the n_j occurrences of j gives ‖w_j‖² / n_j without a unique().
    squares = ops.sum(ops.square(ops.take(table, flat, axis=0)), axis=-1)  # [n]
    return ops.sum(valid * squares / ops.square(n))


@keras.saving.register_keras_serializable(package="rankers")
class Dice(ConstructorConfig, keras.layers.Layer):
    """DIN's data-adaptive activation ``f(s) = p(s)·s + (1 − p(s))·α·s``.

    ``p(s) = σ((s − E[s]) / sqrt(Var[s] + ε))`` per feature, with the batch's statistics in
    training (over the valid rows only, so padding never shifts them) and moving averages at
    inference, as batch normalisation does. ``α`` is learned per feature (initially 0).

    Args:
        momentum: of the moving averages.
        epsilon: ``ε``.

    Call:
        x: ``[N, u]``; valid: optional bool ``[N]`` -> ``[N, u]``.
    """

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.momentum, self.epsilon = momentum, epsilon

    def build(self, input_shape: Any) -> None:
        units = int(input_shape[-1])
        self.alpha = self.add_weight(shape=(units,), initializer="zeros", name="alpha")
        self.moving_mean = self.add_weight(
            shape=(units,), initializer="zeros", trainable=False, name="moving_mean"
        )
        self.moving_variance = self.add_weight(
            shape=(units,), initializer="ones", trainable=False, name="moving_variance"
        )
        self.built = True

    def call(self, x: Any, valid: Any = None, training: bool = False) -> Any:
        if training:
            w = ops.ones_like(x[:, :1]) if valid is None else ops.expand_dims(ops.cast(valid, x.dtype), -1)
            n = ops.sum(w)
            mean = ops.sum(x * w, axis=0) / ops.maximum(n, 1.0)  # [u]
            variance = ops.sum(ops.square(x - mean) * w, axis=0) / ops.maximum(n, 1.0)
            m = self.momentum
            seen = n > 0  # a batch of padding only leaves the averages alone
            self.moving_mean.assign(ops.where(seen, m * self.moving_mean + (1 - m) * mean, self.moving_mean))
            self.moving_variance.assign(
                ops.where(seen, m * self.moving_variance + (1 - m) * variance, self.moving_variance)
            )
        else:
            mean, variance = self.moving_mean, self.moving_variance
        p = ops.sigmoid((x - mean) / ops.sqrt(variance + self.epsilon))
        return p * x + (1.0 - p) * self.alpha * x


@keras.saving.register_keras_serializable(package="rankers")
class ClickMLP(ConstructorConfig, keras.layers.Layer):
    """The final network of a ranker: hidden layers with Dice, PReLU or ReLU, then one logit.

    Args:
        hidden_units: widths of the hidden layers.
        activation: one of :data:`ACTIVATIONS`.
        dropout: rate after each hidden layer (training only).

    Call:
        x: ``[N, F]``; valid: optional bool ``[N]`` (rows Dice's batch statistics use) -> ``[N]``.
    """

    def __init__(
        self, hidden_units: Sequence[int], activation: str = "dice", dropout: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {ACTIVATIONS}")
        self.hidden_units = [int(u) for u in hidden_units]
        self.activation, self.dropout = activation, dropout
        self.dense = [keras.layers.Dense(u) for u in self.hidden_units]
        self.activations = [self.make_activation() for _ in self.hidden_units]
        self.drop = keras.layers.Dropout(dropout)
        self.out = keras.layers.Dense(1)

    def make_activation(self) -> keras.layers.Layer:
        if self.activation == "dice":
            return Dice()
        if self.activation == "prelu":  # α = 0.25 at first, as in He et al. 2015
            return keras.layers.PReLU(alpha_initializer=keras.initializers.Constant(0.25))
        return keras.layers.ReLU()

    def build(self, input_shape: Any) -> None:
        width = int(input_shape[-1])
        for dense, act in zip(self.dense, self.activations, strict=True):
            dense.build((None, width))
            width = dense.units
            act.build((None, width))
        self.out.build((None, width))
        self.built = True

    def call(self, x: Any, valid: Any = None, training: bool = False) -> Any:
        for dense, act in zip(self.dense, self.activations, strict=True):
            x = dense(x)
            x = act(x, valid=valid, training=training) if isinstance(act, Dice) else act(x)
            x = self.drop(x, training=training)
        return ops.squeeze(self.out(x), -1)  # [N]


@keras.saving.register_keras_serializable(package="rankers")
class LocalActivationUnit(ConstructorConfig, keras.layers.Layer):
    """DIN's activation unit: how much each history item matters for each candidate.

    ``w_cl = MLP([k_l, q_c, k_l − q_c, k_l ⊙ q_c])`` with sigmoid hidden layers (as in DIN's
    reference code and :class:`towers.din.DINTower`) and a linear scalar output; ``w = 0`` on
    padded keys. Not softmax-normalised: the weights' size carries how strongly the history
    supports the candidate.

    Args:
        dim: ``d`` of queries and keys.
        units: widths of the hidden layers (at least one).

    Call:
        queries ``[B, C, d]``, keys ``[B, L, d]``, key_valid bool ``[B, L]`` -> ``[B, C, L]``.
    """

    def __init__(self, dim: int, units: Sequence[int] = (80, 40), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not units:
            raise ValueError("the activation unit needs at least one hidden layer")
        self.dim, self.units = dim, [int(u) for u in units]
        self.hidden = [keras.layers.Dense(u, activation="sigmoid") for u in self.units]
        self.weight_layer = keras.layers.Dense(1)

    def build(self, input_shape: Any = None) -> None:
        width = 4 * self.dim
        for layer in self.hidden:
            layer.build((None, width))
            width = layer.units
        self.weight_layer.build((None, width))
        self.built = True

    def call(self, queries: Any, keys: Any, key_valid: Any) -> Any:
        x = activation_first_layer(self.hidden[0], keys, queries)  # [B, C, L, u]
        for layer in self.hidden[1:]:
            x = layer(x)
        w = ops.squeeze(self.weight_layer(x), -1)  # [B, C, L]
        return ops.where(ops.expand_dims(ops.cast(key_valid, "bool"), 1), w, 0.0)


@keras.saving.register_keras_serializable(package="rankers")
class AUGRUCell(ConstructorConfig, keras.layers.Layer):
    """DIEN's GRU with attentional update gate, one step at a time.

    ``u = σ(W_u x + U_u h + b_u)``, ``r = σ(W_r x + U_r h + b_r)``,
    ``h̃ = tanh(W_h x + r ⊙ (U_h h) + b_h)``, ``u' = a·u``, ``h' = (1 − u') ⊙ h + u' ⊙ h̃``:
    with ``a = 0`` the state is carried unchanged, so irrelevant interests barely move it.

    As a ``keras.layers.RNN`` cell its input is ``[x_t, a_t]`` (``[N, input_dim + 1]``, the
    attention score in the last column).

    Args:
        units: state size.
        input_dim: size of ``x_t``.
    """

    def __init__(self, units: int, input_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.input_dim = units, input_dim
        self.state_size = units
        self.output_size = units

    def build(self, input_shape: Any = None) -> None:
        u = self.units
        self.kernel = self.add_weight(
            shape=(self.input_dim, 3 * u), initializer="glorot_uniform", name="kernel"
        )
        self.recurrent_kernel = self.add_weight(
            shape=(u, 3 * u), initializer="orthogonal", name="recurrent_kernel"
        )
        self.bias = self.add_weight(shape=(3 * u,), initializer="zeros", name="bias")
        self.built = True

    def step(self, x: Any, h: Any, a: Any) -> Any:
        """One step: ``x [N, input_dim]``, ``h [N, units]``, ``a [N, 1]`` -> ``h' [N, units]``."""
        u = self.units
        gx = ops.matmul(x, self.kernel) + self.bias  # [N, 3u]: update, reset, candidate
        gh = ops.matmul(h, self.recurrent_kernel)  # [N, 3u]
        update = ops.sigmoid(gx[:, :u] + gh[:, :u])
        reset = ops.sigmoid(gx[:, u : 2 * u] + gh[:, u : 2 * u])
        candidate = ops.tanh(gx[:, 2 * u :] + reset * gh[:, 2 * u :])
        update = a * update  # the attentional update gate
        return (1.0 - update) * h + update * candidate

    def call(self, inputs: Any, states: Any, training: bool = False) -> tuple[Any, list[Any]]:
        h = states[0] if isinstance(states, list | tuple) else states
        out = self.step(inputs[:, :-1], h, inputs[:, -1:])
        return out, [out]
