from scheduler.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeferRequest(_message.Message):
    __slots__ = ("request", "deadline_unix_s")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    request: _messages_pb2.GenerateRequest
    deadline_unix_s: float
    def __init__(self, request: _Optional[_Union[_messages_pb2.GenerateRequest, _Mapping]] = ..., deadline_unix_s: _Optional[float] = ...) -> None: ...

class DeferResponse(_message.Message):
    __slots__ = ("decision", "request_id", "release_at_unix_s", "deadline_unix_s", "reason")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    decision: _messages_pb2.Decision
    request_id: str
    release_at_unix_s: float
    deadline_unix_s: float
    reason: str
    def __init__(self, decision: _Optional[_Union[_messages_pb2.Decision, _Mapping]] = ..., request_id: _Optional[str] = ..., release_at_unix_s: _Optional[float] = ..., deadline_unix_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class GetDeferredRequest(_message.Message):
    __slots__ = ("request_id", "tenant")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class CancelDeferredRequest(_message.Message):
    __slots__ = ("request_id", "tenant")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeferredStatus(_message.Message):
    __slots__ = ("request_id", "state", "release_at_unix_s", "deadline_unix_s", "reason", "detail", "decision", "text", "receipt", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    state: str
    release_at_unix_s: float
    deadline_unix_s: float
    reason: str
    detail: str
    decision: _messages_pb2.Decision
    text: str
    receipt: _messages_pb2.EnergyReceipt
    error: str
    def __init__(self, request_id: _Optional[str] = ..., state: _Optional[str] = ..., release_at_unix_s: _Optional[float] = ..., deadline_unix_s: _Optional[float] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., decision: _Optional[_Union[_messages_pb2.Decision, _Mapping]] = ..., text: _Optional[str] = ..., receipt: _Optional[_Union[_messages_pb2.EnergyReceipt, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

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
