"""The settings of an index build (:class:`IndexConfig`): the backend, FAISS's factory string and
search parameters (or a Milvus collection's, :class:`MilvusConfig`), and the tuning to a recall
target against exact search.

``mitt build-index`` resolves one as ``mitt train`` resolves its :class:`~retrieval.training.Config`
(:mod:`retrieval.config`): the defaults, ``--config FILE``, the flags that stand for its fields,
every ``--set``; then :func:`resolve_index_config` checks the fields that go together. This
module imports nothing but the configuration mechanism, so all of it is checked before FAISS,
pandas or TensorFlow is loaded.

Example:
    >>> resolve_index_config(IndexConfig(factory="auto")).target_recall  # tuned: to 0.99 by default
    0.99
    >>> IndexConfig(k=0)
    Traceback (most recent call last):
    retrieval.config.FieldError: IndexConfig.k=0: must be >= 1
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from retrieval.config import PositiveFloat, PositiveInt, Range, Seed, check_fields

__all__ = [
    "AUTO_FACTORY",
    "AUTO_TARGET_RECALL",
    "BACKENDS",
    "Backend",
    "IndexConfig",
    "MilvusConfig",
    "resolve_index_config",
]

Backend = Literal["faiss", "milvus"]
"""``IndexConfig.backend``: where the vectors live."""
BACKENDS: tuple[str, ...] = typing.get_args(Backend)

AUTO_FACTORY = "auto"
"""``IndexConfig.factory`` that tunes the index type too (``index.candidate_factories``)."""
AUTO_TARGET_RECALL = 0.99
"""The recall ``factory="auto"`` tunes to when no ``target_recall`` is given."""


@dataclass(frozen=True)
class MilvusConfig:
    """A Milvus collection (``IndexConfig.backend = "milvus"``).

    Attributes:
        uri: a milvus-lite file (``runs/items.db``) or a server (``http://host:19530``).
        collection: the collection to create (``None``: ``items_<model version>``).
        index_type: Milvus' index type: ``FLAT``, ``HNSW``, ``IVF_FLAT``, ``IVF_PQ``...
        index_params: its build parameters, e.g. ``{"M": 32, "efConstruction": 200}``.
        token_env: the environment variable holding the server's token (``None``:
            ``MILVUS_TOKEN``); the artifact records its name, never the token.
    """

    uri: str | None = None
    collection: str | None = None
    index_type: str = "HNSW"
    index_params: dict[str, Any] = field(default_factory=dict)
    token_env: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class IndexConfig:
    """How ``mitt build-index`` builds, tunes and measures an index over a model's items.

    Attributes:
        backend: ``faiss`` (an ``index.faiss`` in the artifact) or ``milvus`` (a collection).
        factory: FAISS's factory string (``HNSW32``, ``IVF1024,Flat``, ``OPQ16,IVF4096,PQ16``),
            or ``auto``: the cheapest index type reaching ``target_recall``.
        search_params: FAISS's search parameters (``nprobe=16``), or Milvus' as a JSON object
            (``{"ef": 128}``).
        target_recall: tune: the cheapest search parameters (and with ``auto``, index type)
            reaching this recall@k against exact search (``None``: no tuning, unless ``auto``).
        k: the recall cut-off of the tuning and of the measurement written to the manifest.
        num_users: users sampled from the command's ``--data`` as tuning queries.
        train_size: vectors sampled to train IVF/PQ (``None``: FAISS's own choice).
        max_build_seconds: tuning prefers indexes built within this time.
        seed: the users' and the training vectors' samples.
        milvus: the collection, when ``backend`` is ``milvus``.
    """

    backend: Backend = "faiss"
    factory: str = "Flat"
    search_params: str = ""
    target_recall: Annotated[float, Range(0, 1, low_open=True)] | None = None
    k: PositiveInt = 50
    num_users: PositiveInt = 1000
    train_size: PositiveInt | None = None
    max_build_seconds: PositiveFloat | None = None
    seed: Seed = 0
    milvus: MilvusConfig = field(default_factory=MilvusConfig)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def milvus_search_params(self) -> dict[str, Any]:
        """``search_params`` read as Milvus' JSON object (empty: ``{}``).

        Raises:
            ValueError: text that is not a JSON object.
        """
        return _json_object("--search-params", self.search_params)


def resolve_index_config(config: IndexConfig) -> IndexConfig:
    """``config`` as a build uses it, once every layer is applied: ``factory="auto"`` without a
    ``target_recall`` tunes to :data:`AUTO_TARGET_RECALL`.

    Fields that go together are checked here, not when a config is built, where a layer
    setting one of them (``--set backend=milvus``) would be refused before the next sets the
    other (``--set milvus.uri=...``). The messages name the flags, the fields' shortcuts.

    Raises:
        ValueError: Milvus without a ``uri``, or with FAISS's tuning, or search parameters that
            are not a JSON object; Milvus settings for FAISS.
    """
    milvus = config.milvus
    if config.backend == "milvus":
        if not milvus.uri:
            raise ValueError("--backend milvus needs --uri")
        default = IndexConfig()
        if config.factory != default.factory or config.target_recall is not None:
            raise ValueError("--factory and --target-recall tune FAISS indexes; for Milvus give --index-type")
        _json_object("--search-params", config.search_params)
    elif milvus.uri or milvus.collection or milvus.index_params or milvus.token_env:
        raise ValueError("--uri, --collection, --index-params and --token-env are for --backend milvus")
    if config.factory == AUTO_FACTORY and config.target_recall is None:
        return dataclasses.replace(config, target_recall=AUTO_TARGET_RECALL)
    return config


def _json_object(flag: str, text: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object (empty: ``{}``).

    Raises:
        ValueError: ``--flag must be a JSON object: <why>``.
    """
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text}")
    return value
