from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetrieveRequest(_message.Message):
    __slots__ = ("history", "k", "events")
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    history: _containers.RepeatedScalarFieldContainer[str]
    k: int
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, history: _Optional[_Iterable[str]] = ..., k: _Optional[int] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("item_id", "score", "interest")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    INTEREST_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    score: float
    interest: int
    def __init__(self, item_id: _Optional[str] = ..., score: _Optional[float] = ..., interest: _Optional[int] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("items", "model_version", "unknown_items")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    model_version: str
    unknown_items: int
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ..., model_version: _Optional[str] = ..., unknown_items: _Optional[int] = ...) -> None: ...
