"""TensorFlow functions compiled by XLA on inputs zero-padded to a few fixed shapes.

XLA compiles a program per input shape (0.3-1 s each, on first use), so callers pad every
varying dimension to one of a few sizes (:func:`padded_size`, :func:`pad_to`) and slice the
answer: the user tower pads its batch to :data:`COMPILED_BATCHES`
(:func:`retrieval.artifacts.model.compiled_tower`), a ranker its batch and its candidate lists
to :data:`COMPILED_WIDTHS` (:class:`retrieval.artifacts.ranker_scorer.RankerScorer`). Should XLA refuse
a function (an op without an XLA kernel), :class:`XlaFunction` logs it once and runs the plain
graph from then on. TensorFlow keeps every compiled program for the life of the process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

COMPILED_BATCHES = (1, 8, 32, 256, 1024)
"""Batch sizes compiled functions run at: a batch is padded to the next one (larger batches go
in chunks of the last), so XLA compiles at most five batch shapes."""

COMPILED_WIDTHS = (16, 32, 64, 200, 512, 1000)
"""Widths a compiled ranker's candidate (and unclicked) lists are padded to: 200 is the default
rerank depth (``retrieval.api.types.DEFAULT_RERANK_CANDIDATES``), so the common case is not
padded at all; 1000 the most a request may rerank."""


def padded_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest of ``sizes`` (ascending) that is at least ``n``; ``None`` beyond the last."""
    return next((s for s in sizes if s >= n), None)


def pad_to(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``array`` zero-padded at the end of each axis to ``shape`` (at least its own)."""
    widths = [(0, target - size) for size, target in zip(array.shape, shape, strict=True)]
    return np.pad(array, widths) if any(after for _, after in widths) else array


class XlaFunction:
    """``fn`` compiled by XLA, with ``plain`` (the uncompiled graph) as the fallback should XLA
    refuse it; safe to call from several threads.

    Args:
        fn: a function of a dict of tensors returning one tensor.
        plain: what runs once XLA has refused ``fn`` (``fn`` itself when ``None``), e.g. an
            existing ``tf.function`` of it.
        what: names the function in the warning.
        input_signature: a dict of ``tf.TensorSpec`` for ``fn``'s one argument: the function
            is then traced once (XLA still compiles once per concrete shape) and called
            through its concrete function, which skips ``tf.function``'s per-call argument
            matching (about 0.25 ms a call).

    Example:
        >>> double = XlaFunction(lambda x: 2 * x["a"], what="double")
        >>> double({"a": tf.constant([1.0])})  # array([2.], dtype=float32)
    """

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Any],
        plain: Callable[[dict[str, Any]], Any] | None = None,
        what: str = "this function",
        input_signature: Mapping[str, Any] | None = None,
    ) -> None:
        import tensorflow as tf

        self.what = what
        self.plain = plain or fn
        signature = None if input_signature is None else [dict(input_signature)]
        function = tf.function(fn, input_signature=signature, jit_compile=True, autograph=False)
        self.compiled: Callable[[dict[str, Any]], Any] = (
            function if signature is None else function.get_concrete_function()
        )
        self.refused = False

    def __call__(self, inputs: dict[str, Any]) -> np.ndarray:
        """``fn(inputs)`` as numpy: compiled, or plain once XLA has refused it."""
        import tensorflow as tf

        if not self.refused:
            try:
                return self.compiled(inputs).numpy()
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
                logger.warning("XLA cannot compile %s, running the plain graph: %s", self.what, e)
                self.refused = True
        return self.plain(inputs).numpy()
