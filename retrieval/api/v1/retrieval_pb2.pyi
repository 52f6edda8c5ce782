import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MergeStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MERGE_STRATEGY_UNSPECIFIED: _ClassVar[MergeStrategy]
    MAX_SCORE: _ClassVar[MergeStrategy]
    ROUND_ROBIN: _ClassVar[MergeStrategy]
    DIVERSITY: _ClassVar[MergeStrategy]

class ExplanationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLANATION_KIND_UNSPECIFIED: _ClassVar[ExplanationKind]
    EXPLANATION_KIND_ATTENTION: _ClassVar[ExplanationKind]
    EXPLANATION_KIND_ROUTING: _ClassVar[ExplanationKind]
    EXPLANATION_KIND_NONE: _ClassVar[ExplanationKind]
    EXPLANATION_KIND_UNAVAILABLE: _ClassVar[ExplanationKind]
MERGE_STRATEGY_UNSPECIFIED: MergeStrategy
MAX_SCORE: MergeStrategy
ROUND_ROBIN: MergeStrategy
DIVERSITY: MergeStrategy
EXPLANATION_KIND_UNSPECIFIED: ExplanationKind
EXPLANATION_KIND_ATTENTION: ExplanationKind
EXPLANATION_KIND_ROUTING: ExplanationKind
EXPLANATION_KIND_NONE: ExplanationKind
EXPLANATION_KIND_UNAVAILABLE: ExplanationKind

class RetrieveRequest(_message.Message):
    __slots__ = ("history", "k", "events", "merge", "diversity_lambda", "per_interest_k", "exclude_ids", "allow_ids", "return_interests", "user_id", "category", "request_time", "rerank", "explain")
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    DIVERSITY_LAMBDA_FIELD_NUMBER: _ClassVar[int]
    PER_INTEREST_K_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_IDS_FIELD_NUMBER: _ClassVar[int]
    RETURN_INTERESTS_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    history: _containers.RepeatedScalarFieldContainer[str]
    k: int
    events: _containers.RepeatedCompositeFieldContainer[Event]
    merge: MergeStrategy
    diversity_lambda: float
    per_interest_k: int
    exclude_ids: _containers.RepeatedScalarFieldContainer[str]
    allow_ids: _containers.RepeatedScalarFieldContainer[str]
    return_interests: bool
    user_id: str
    category: str
    request_time: int
    rerank: Rerank
    explain: bool
    def __init__(self, history: _Optional[_Iterable[str]] = ..., k: _Optional[int] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., merge: _Optional[_Union[MergeStrategy, str]] = ..., diversity_lambda: _Optional[float] = ..., per_interest_k: _Optional[int] = ..., exclude_ids: _Optional[_Iterable[str]] = ..., allow_ids: _Optional[_Iterable[str]] = ..., return_interests: _Optional[bool] = ..., user_id: _Optional[str] = ..., category: _Optional[str] = ..., request_time: _Optional[int] = ..., rerank: _Optional[_Union[Rerank, _Mapping]] = ..., explain: _Optional[bool] = ...) -> None: ...

class Rerank(_message.Message):
    __slots__ = ("ranker", "candidates", "unclicked")
    RANKER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    UNCLICKED_FIELD_NUMBER: _ClassVar[int]
    ranker: str
    candidates: int
    unclicked: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ranker: _Optional[str] = ..., candidates: _Optional[int] = ..., unclicked: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("item_id", "timestamp", "action")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    timestamp: int
    action: str
    def __init__(self, item_id: _Optional[str] = ..., timestamp: _Optional[int] = ..., action: _Optional[str] = ...) -> None: ...

class ScoredItem(_message.Message):
    __slots__ = ("item_id", "score", "interest", "rank_score")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    INTEREST_FIELD_NUMBER: _ClassVar[int]
    RANK_SCORE_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    score: float
    interest: int
    rank_score: float
    def __init__(self, item_id: _Optional[str] = ..., score: _Optional[float] = ..., interest: _Optional[int] = ..., rank_score: _Optional[float] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("items", "model_version", "unknown_items", "interests", "ranker_version", "explanations")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_ITEMS_FIELD_NUMBER: _ClassVar[int]
    INTERESTS_FIELD_NUMBER: _ClassVar[int]
    RANKER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPLANATIONS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    model_version: str
    unknown_items: int
    interests: _containers.RepeatedCompositeFieldContainer[Interest]
    ranker_version: str
    explanations: Explanations
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ..., model_version: _Optional[str] = ..., unknown_items: _Optional[int] = ..., interests: _Optional[_Iterable[_Union[Interest, _Mapping]]] = ..., ranker_version: _Optional[str] = ..., explanations: _Optional[_Union[Explanations, _Mapping]] = ...) -> None: ...

class Explanations(_message.Message):
    __slots__ = ("kind", "interests")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INTERESTS_FIELD_NUMBER: _ClassVar[int]
    kind: ExplanationKind
    interests: _containers.RepeatedCompositeFieldContainer[InterestExplanation]
    def __init__(self, kind: _Optional[_Union[ExplanationKind, str]] = ..., interests: _Optional[_Iterable[_Union[InterestExplanation, _Mapping]]] = ...) -> None: ...

class InterestExplanation(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WeightedEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[WeightedEvent, _Mapping]]] = ...) -> None: ...

class WeightedEvent(_message.Message):
    __slots__ = ("item_id", "weight", "position")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    weight: float
    position: int
    def __init__(self, item_id: _Optional[str] = ..., weight: _Optional[float] = ..., position: _Optional[int] = ...) -> None: ...

class Interest(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class BatchRetrieveRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RetrieveRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RetrieveRequest, _Mapping]]] = ...) -> None: ...

class BatchRetrieveResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[RetrieveResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[RetrieveResponse, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IndexInfo(_message.Message):
    __slots__ = ("backend", "factory", "search_params", "is_exact", "recall", "recall_k", "count")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    FACTORY_FIELD_NUMBER: _ClassVar[int]
    SEARCH_PARAMS_FIELD_NUMBER: _ClassVar[int]
    IS_EXACT_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    RECALL_K_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    backend: str
    factory: str
    search_params: str
    is_exact: bool
    recall: float
    recall_k: int
    count: int
    def __init__(self, backend: _Optional[str] = ..., factory: _Optional[str] = ..., search_params: _Optional[str] = ..., is_exact: _Optional[bool] = ..., recall: _Optional[float] = ..., recall_k: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_version", "tower", "num_interests", "dim", "max_len", "num_items", "index", "side_features", "start_time", "rankers", "reload_refusals", "last_refusal", "access_file_error")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOWER_FIELD_NUMBER: _ClassVar[int]
    NUM_INTERESTS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    NUM_ITEMS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SIDE_FEATURES_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    RANKERS_FIELD_NUMBER: _ClassVar[int]
    RELOAD_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    LAST_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FILE_ERROR_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    tower: str
    num_interests: int
    dim: int
    max_len: int
    num_items: int
    index: IndexInfo
    side_features: _containers.RepeatedScalarFieldContainer[str]
    start_time: _timestamp_pb2.Timestamp
    rankers: _containers.RepeatedScalarFieldContainer[str]
    reload_refusals: int
    last_refusal: str
    access_file_error: str
    def __init__(self, model_version: _Optional[str] = ..., tower: _Optional[str] = ..., num_interests: _Optional[int] = ..., dim: _Optional[int] = ..., max_len: _Optional[int] = ..., num_items: _Optional[int] = ..., index: _Optional[_Union[IndexInfo, _Mapping]] = ..., side_features: _Optional[_Iterable[str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rankers: _Optional[_Iterable[str]] = ..., reload_refusals: _Optional[int] = ..., last_refusal: _Optional[str] = ..., access_file_error: _Optional[str] = ...) -> None: ...
