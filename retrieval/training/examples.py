"""Training examples for each objective, cut from per-user event sequences.

Events are given as parallel per-user arrays: ``events["items"][u]`` are user u's dense item
ids (oldest first) and every other key (side features such as ``action`` or ``gap_prev``) holds
one value per event, aligned with them. Inputs come out left-padded with 0 to ``max_len``
(newest event in the last column), as the towers expect.

Objectives:
    ``last``: every prefix -> its next item (ComiRec, YouTube DNN): inputs ``[N, L]``, targets ``[N]``.
    ``all_positions``: SASRec's training, every position predicts the next item: windows of
        ``L + 1`` events, inputs = window[:-1], targets = window[1:] (0 = no target) ``[N, L]``.
    ``cloze``: BERT4Rec, windows of ``L`` events whose items are masked at random per batch
        (:func:`mask_items`), targets ``[N, L]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from retrieval.data.features import gap_buckets
from retrieval.training.config import OBJECTIVES

Events = Mapping[str, Sequence[np.ndarray]]


def _gather(
    events: Events, users: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int
) -> dict[str, np.ndarray]:
    """``events[name][u][start:end]`` per span, left-padded to ``max_len``: ``{name: int32 [N, max_len]}``."""
    lengths = ends - starts
    # Column j of a row holds event ``end - max_len + j``; columns before the span are padding.
    cols = ends[:, None] - max_len + np.arange(max_len)[None, :]  # [N, L]
    valid = cols >= (ends - lengths)[:, None]
    out = {}
    for name, per_user in events.items():
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in per_user])])
        flat = np.concatenate([np.asarray(a) for a in per_user]) if len(per_user) else np.zeros(0)
        index = offsets[users][:, None] + np.where(valid, cols, 0)
        values = flat[index] if len(flat) else np.zeros(index.shape)
        out[name] = np.where(valid, values, 0).astype(np.int32)
    return out


def next_item_examples(events: Events, max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Objective ``last``: for each user and ``t`` in ``1..n-1``, events ``[t - L, t)`` -> item ``t``.

    A ``gap_now`` entry holds raw event timestamps; it comes out as the bucketised time from
    each input event to the target event (the request time of that example).
    """
    lengths = np.array([len(s) for s in events["items"]])
    users = np.repeat(np.arange(len(lengths)), np.maximum(lengths - 1, 0))
    ends = np.concatenate([np.arange(1, n) for n in lengths]) if len(lengths) else np.zeros(0, int)
    inputs = _gather(events, users, np.maximum(ends - max_len, 0), ends, max_len)
    targets = _gather({"items": events["items"]}, users, ends, ends + 1, 1)["items"][:, 0]
    if "gap_now" in events:
        now = _gather({"t": events["gap_now"]}, users, ends, ends + 1, 1)["t"]  # [N, 1]
        inputs["gap_now"] = np.where(inputs["items"] > 0, gap_buckets(now - inputs["gap_now"]), 0).astype(
            np.int32
        )
    return inputs, targets


def _window_ends(lengths: np.ndarray, size: int, min_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of ``size`` events ending at each sequence's end, then every ``size`` back."""
    users, ends = [], []
    for u, n in enumerate(lengths):
        e = np.arange(n, min_len - 1, -size)
        users.append(np.full(len(e), u))
        ends.append(e)
    if not users:
        return np.zeros(0, int), np.zeros(0, int)
    return np.concatenate(users), np.concatenate(ends)


def shifted_windows(events: Events, max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Objective ``all_positions``: inputs = events ``[e - L - 1, e - 1)``, targets = items ``[e - L, e)``.

    Windows end at each sequence's last event and then every ``max_len`` events back, so every
    training event is a target exactly once.
    """
    lengths = np.array([len(s) for s in events["items"]])
    users, ends = _window_ends(lengths, max_len, 2)
    starts = np.maximum(ends - max_len - 1, 0)
    inputs = _gather(events, users, starts, ends - 1, max_len)
    targets = _gather({"items": events["items"]}, users, starts + 1, ends, max_len)["items"]
    return inputs, targets


def cloze_windows(events: Events, max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Objective ``cloze``: windows of ``max_len`` events (inputs) and their items (targets, masked later)."""
    lengths = np.array([len(s) for s in events["items"]])
    users, ends = _window_ends(lengths, max_len, 1)
    inputs = _gather(events, users, np.maximum(ends - max_len, 0), ends, max_len)
    return inputs, inputs["items"].copy()


def make_examples(objective: str, events: Events, max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Examples for ``objective`` (one of :data:`OBJECTIVES`)."""
    builders = {"last": next_item_examples, "all_positions": shifted_windows, "cloze": cloze_windows}
    if objective not in builders:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    if "gap_now" in events and objective != "last":
        # One window serves every position's prediction, each at another request time.
        raise ValueError(f"side feature 'gap_now' needs objective 'last', not {objective!r}")
    return builders[objective](events, max_len)


def mask_items(
    inputs: dict[str, Any], targets: Any, mask_id: int, ratio: float, seed: Any = None
) -> tuple[dict[str, Any], Any]:
    """BERT4Rec's cloze masking for a batch: each item is replaced by ``mask_id`` with probability
    ``ratio`` and becomes a target; the rest get target 0. Rows with no masked item get their
    newest item masked, which is also exactly the serving-time task.

    Args:
        inputs: ``{"items": int32 [B, L], ...}``; targets: int32 ``[B, L]`` (the unmasked items).
        seed: int ``[2]`` for a stateless draw (the same seed masks the same items: training
            passes ``(run seed, step)`` so a resumed run masks like an uninterrupted one);
            ``None`` draws from TensorFlow's global generator.
    """
    items = inputs["items"]
    real = items > 0
    shape = tf.shape(items)
    draw = tf.random.uniform(shape) if seed is None else tf.random.stateless_uniform(shape, seed)
    chosen = tf.logical_and(real, draw < ratio)
    newest = tf.one_hot(tf.shape(items)[1] - 1, tf.shape(items)[1], on_value=True, off_value=False)
    none = tf.logical_not(tf.reduce_any(chosen, axis=1, keepdims=True))
    chosen = tf.logical_or(chosen, tf.logical_and(none, tf.logical_and(real, newest[None, :])))
    masked = dict(inputs)
    masked["items"] = tf.where(chosen, tf.cast(mask_id, items.dtype), items)
    return masked, tf.where(chosen, targets, tf.zeros_like(targets))
