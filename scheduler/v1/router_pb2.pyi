from scheduler.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: _messages_pb2.Decision
    def __init__(self, decision: _Optional[_Union[_messages_pb2.Decision, _Mapping]] = ...) -> None: ...

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
