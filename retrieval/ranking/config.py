"""The configuration of a ranker's training (:class:`RankerConfig`) and its checks."""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rankers import ranker_names
from retrieval.artifacts.ranker import (
    DEFAULT_NUM_UNCLICKED,
    DEFAULT_UNCLICKED,
)

NEGATIVE_SOURCES = ("retrieved", "uniform", "popularity")


RETRIEVAL_FITS = ("lists", "clicks", "joint")


UNCLICKED_MODES = ("previous", "none")


ITEM_INITS = ("retriever", "random")


KS = (10,)
"""Cut-offs of the reranking metrics."""


@dataclass(frozen=True)
class RankerConfig:
    """A ranker, its click examples and its training loop (see the module docstring).

    ``max_len`` is the history a ranker reads, the most recent events (20 by default: the cost
    of DIN's activation unit and of DIEN's per-candidate AUGRU grows with it, measured 2× and 4×
    per training step from 20 to 50, and Amazon Beauty's sequences average 8.9 events).
    ``item_init="retriever"`` starts the ranker's item table from the retrieval model's item
    embeddings (``"random"``: Keras' initialiser); ``dim`` 0 = the retrieval model's dimension
    (required by ``retriever``). ``options`` are extra constructor arguments of the ranker
    (``hidden_units``, ``activation``, ``aux_weight``...; see :mod:`rankers`). ``candidates`` is
    the retrieval depth: the pool of ``retrieved`` negatives and the list reranked in evaluation.
    ``retrieved_positives_only`` keeps only the examples whose click is among the retriever's
    top ``candidates`` for that history (training and validation). ``context_size`` is DSTN's
    context (its ``context_size`` argument: the request's top retrieved items other than the
    candidate; 0 = every other candidate) and sets the width of the examples' ``context``.
    ``retrieval_fit`` says where a ranker reading the retrieval scores learns ``g``, ``w``, ``b``
    (:class:`rankers.Ranker`). ``"lists"`` (default) and ``"clicks"`` train the ranker's own part
    alone (``g = 1``, ``w = b = 0`` frozen) and fit the blend after each epoch on held-out data
    (stacking): ``"lists"`` on the validation users' whole retrieved lists, reranked as the test
    lists are, with the listwise softmax loss of the validation click (:func:`fit_list_blend`;
    ``b`` then calibrates the logits on the validation clicks), the monitored metric being that
    loss; ``"clicks"`` on the validation click examples (logistic, :func:`fit_blend`), monitoring
    their GAUC. ``"joint"`` trains ``g``, ``w``, ``b`` with the ranker on the training clicks
    (from ``g = 0`` and ``w``, ``b`` the logistic fit of the training clicks on the score).
    The retriever was trained on the training clicks, so its scores of them are in-sample: on
    Amazon Beauty the retrieval score alone has GAUC 0.823 on the training clicks and 0.753 on
    the held-out validation clicks. Trained jointly, a ranker leans on a score that is better
    in training than at test time (its validation GAUC fell below the retriever's from the first
    epoch on, for AFM); the validation clicks are held out from both the retriever and the
    ranker's own part, and three parameters cannot overfit them. Fitted on click examples (21
    candidates drawn from the top 200), the blend ranks those well but weighs the ranker's part
    for the whole list, not for its head, where NDCG@10 is decided (AFM on 3,000 Beauty test
    users: GAUC 0.735 -> 0.750 but NDCG@10 0.0498 -> 0.0448): ``"lists"`` fits it on the task.
    ``max_test_users`` > 0 evaluates a seeded sample of that many test users (0 = all).
    """

    ranker: str = "din"
    dim: int = 0
    item_init: str = "retriever"
    max_len: int = 20
    attributes: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    negatives: str = "retrieved"
    num_negatives: int = 20
    retrieved_positives_only: bool = True
    positions_per_user: int = 10
    candidates: int = 200
    unclicked: str = DEFAULT_UNCLICKED
    num_unclicked: int = DEFAULT_NUM_UNCLICKED
    context_size: int = 20
    retrieval_fit: str = "lists"
    epochs: int = 10
    batch_size: int = 256
    learning_rate: float = 1e-3
    patience: int = 2
    seed: int = 42
    max_test_users: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def negative_counts(config: RankerConfig) -> dict[str, int]:
    """Negatives per source, ``num_negatives`` shared evenly (the first sources take the remainder).

    Raises:
        ValueError: an unknown or repeated source, or fewer negatives than sources.
    """
    sources = [s.strip() for s in config.negatives.split("+")]
    unknown = [s for s in sources if s not in NEGATIVE_SOURCES]
    if unknown or len(set(sources)) != len(sources):
        raise ValueError(
            f"negatives {config.negatives!r}: expected sources from {NEGATIVE_SOURCES} joined by '+'"
        )
    if config.num_negatives < len(sources):
        raise ValueError(f"num_negatives ({config.num_negatives}) must be at least one per source")
    base, extra = divmod(config.num_negatives, len(sources))
    return {s: base + (i < extra) for i, s in enumerate(sources)}


def check_config(config: RankerConfig) -> None:
    """Raises ``ValueError`` for a configuration that cannot be trained."""
    if config.ranker not in ranker_names():
        raise ValueError(f"unknown ranker {config.ranker!r}; choose one of {ranker_names()}")
    negative_counts(config)
    if config.item_init not in ITEM_INITS:
        raise ValueError(f"item_init must be one of {ITEM_INITS}, got {config.item_init!r}")
    if config.unclicked not in UNCLICKED_MODES:
        raise ValueError(f"unclicked must be one of {UNCLICKED_MODES}, got {config.unclicked!r}")
    if config.candidates < max(KS):
        raise ValueError(f"candidates must be at least {max(KS)} (NDCG@{max(KS)}), got {config.candidates}")
    for name in ("max_len", "positions_per_user", "epochs", "batch_size", "num_unclicked"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.dim < 0 or config.patience < 0 or config.max_test_users < 0 or config.learning_rate <= 0:
        raise ValueError("dim, patience and max_test_users must be >= 0, learning_rate > 0")
    if config.retrieval_fit not in RETRIEVAL_FITS:
        raise ValueError(f"retrieval_fit must be one of {RETRIEVAL_FITS}, got {config.retrieval_fit!r}")
    if config.context_size < 0:
        raise ValueError(f"context_size must be >= 0, got {config.context_size}")
    if "context_size" in config.options:
        raise ValueError(
            "set DSTN's context with context_size=N, not options.context_size (it sizes the examples)"
        )


def apply_ranker_overrides(config: RankerConfig, overrides: Iterable[str]) -> RankerConfig:
    """``field=value`` overrides (typed by the field), and ``options.NAME=JSON`` for the ranker's
    constructor arguments (a value that is not JSON is taken as text).

    Example:
        >>> apply_ranker_overrides(RankerConfig(), ["epochs=3", "options.hidden_units=[64, 32]"]).options
        {'hidden_units': [64, 32]}

    Raises:
        ValueError: not ``key=value``, an unknown field, or a value of the wrong type.
    """
    hints = typing.get_type_hints(RankerConfig)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form field=value")
        if key.startswith("options.") and len(key) > len("options."):
            try:
                value: Any = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
            config = dataclasses.replace(config, options={**config.options, key[len("options.") :]: value})
            continue
        if key not in hints or key == "options":
            fields = sorted(k for k in hints if k != "options")
            raise ValueError(f"unknown ranker setting {key!r}; choose from {fields} or options.NAME")
        kind = hints[key]
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key}: expected true/false, got {raw!r}")
            value = raw.lower() in ("true", "1")
        else:
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{key}: expected {kind.__name__}, got {raw!r}") from None
        config = dataclasses.replace(config, **{key: value})
    return config
