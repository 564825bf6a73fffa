from scheduler.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteResponse(_message.Message):
    __slots__ = ("decision", "targets")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    decision: _messages_pb2.Decision
    targets: _containers.RepeatedCompositeFieldContainer[DirectTarget]
    def __init__(self, decision: _Optional[_Union[_messages_pb2.Decision, _Mapping]] = ..., targets: _Optional[_Iterable[_Union[DirectTarget, _Mapping]]] = ...) -> None: ...

class DirectTarget(_message.Message):
    __slots__ = ("region", "pool", "model", "url", "ticket", "expires_at_unix_s")
    REGION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    region: str
    pool: str
    model: str
    url: str
    ticket: str
    expires_at_unix_s: float
    def __init__(self, region: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ..., url: _Optional[str] = ..., ticket: _Optional[str] = ..., expires_at_unix_s: _Optional[float] = ...) -> None: ...

class ListRegionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRegionsResponse(_message.Message):
    __slots__ = ("regions", "snapshot_at_unix_s")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[_messages_pb2.RegionInfo]
    snapshot_at_unix_s: float
    def __init__(self, regions: _Optional[_Iterable[_Union[_messages_pb2.RegionInfo, _Mapping]]] = ..., snapshot_at_unix_s: _Optional[float] = ...) -> None: ...
