"""The configuration of a ranker's training (:class:`RankerConfig`) and its checks.

Overrides (``--set field=value``, ``--set options.NAME=JSON``) and config files are
:mod:`retrieval.config`'s, as for every config; the ``Literal`` fields and the numeric ranges
are checked when a config is built, the rest (the ranker's name, which needs the
:mod:`rankers` registry and so TensorFlow, and the negatives' sources) by :func:`check_config`
before training.
``docs/configuration.md`` keeps the measurements behind the defaults.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from retrieval.artifacts.ranker import DEFAULT_NUM_UNCLICKED, DEFAULT_UNCLICKED
from retrieval.config import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Range,
    Seed,
    check_fields,
    config_to_dict,
)

NEGATIVE_SOURCES = ("retrieved", "uniform", "popularity")
"""Sources of ``RankerConfig.negatives``, joined by ``+``."""

ItemInit = Literal["retriever", "random"]
"""``RankerConfig.item_init``: the item table from the retriever's embeddings, or Keras' initialiser."""
UnclickedMode = Literal["previous", "none"]
"""``RankerConfig.unclicked``: DSTN's unclicked items (:mod:`retrieval.ranking`)."""
RetrievalFit = Literal["lists", "clicks", "joint"]
"""``RankerConfig.retrieval_fit``: where the blend with the retrieval score is learned."""

ITEM_INITS: tuple[ItemInit, ...] = typing.get_args(ItemInit)
UNCLICKED_MODES: tuple[UnclickedMode, ...] = typing.get_args(UnclickedMode)
RETRIEVAL_FITS: tuple[RetrievalFit, ...] = typing.get_args(RetrievalFit)

_DEFAULT_UNCLICKED = typing.cast(UnclickedMode, DEFAULT_UNCLICKED)  # a str there; checked by check_fields

KS = (10,)
"""Cut-offs of the reranking metrics."""
Candidates = Annotated[int, Range(max(KS))]
"""A reranked list is at least as long as the longest cut-off."""


@dataclass(frozen=True)
class RankerConfig:
    """A ranker, its click examples and its training loop (see :mod:`retrieval.ranking`).

    ``max_len`` is the history a ranker reads, the most recent events (the cost of DIN's
    activation unit and of DIEN's per-candidate AUGRU grows with it).
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
    (from ``g = 0`` and ``w``, ``b`` the logistic fit of the training clicks on the score); the
    retriever's scores of its own training clicks are in-sample, which is why the default fits
    the blend on held-out validation lists (``docs/configuration.md`` has the measurements).
    ``max_test_users`` > 0 evaluates a seeded sample of that many test users (0 = all).
    """

    ranker: str = "din"
    dim: NonNegativeInt = 0
    item_init: ItemInit = "retriever"
    max_len: PositiveInt = 20
    attributes: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    negatives: str = "retrieved"
    num_negatives: PositiveInt = 20
    retrieved_positives_only: bool = True
    positions_per_user: PositiveInt = 10
    candidates: Candidates = 200
    unclicked: UnclickedMode = _DEFAULT_UNCLICKED
    num_unclicked: PositiveInt = DEFAULT_NUM_UNCLICKED
    context_size: NonNegativeInt = 20
    retrieval_fit: RetrievalFit = "lists"
    epochs: PositiveInt = 10
    batch_size: PositiveInt = 256
    learning_rate: PositiveFloat = 1e-3
    patience: NonNegativeInt = 2
    seed: Seed = 42
    max_test_users: NonNegativeInt = 0

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)


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
    """Raises ``ValueError`` for a configuration that cannot be trained (loads :mod:`rankers`, so
    TensorFlow: the ``Literal`` fields and the ranges were checked when ``config`` was built)."""
    from rankers import ranker_names

    if config.ranker not in ranker_names():
        raise ValueError(f"unknown ranker {config.ranker!r}; choose one of {ranker_names()}")
    negative_counts(config)
    if "context_size" in config.options:
        raise ValueError(
            "set DSTN's context with context_size=N, not options.context_size (it sizes the examples)"
        )
