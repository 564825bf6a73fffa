from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SetEnergyRoutingRequest(_message.Message):
    __slots__ = ("enabled", "reason")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    reason: str
    def __init__(self, enabled: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SetEnergyRoutingResponse(_message.Message):
    __slots__ = ("enabled", "updated_at_unix_s", "updated_by")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    updated_at_unix_s: float
    updated_by: str
    def __init__(self, enabled: _Optional[bool] = ..., updated_at_unix_s: _Optional[float] = ..., updated_by: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("energy_routing", "policy", "state_backend", "namespace", "state_reachable", "last_state_read_unix_s", "last_state_error", "snapshot_at_unix_s", "regions", "candidates", "healthy_regions", "fresh_carbon_zones", "active_streams", "version")
    ENERGY_ROUTING_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STATE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATE_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    LAST_STATE_READ_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAST_STATE_ERROR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_REGIONS_FIELD_NUMBER: _ClassVar[int]
    FRESH_CARBON_ZONES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    energy_routing: bool
    policy: str
    state_backend: str
    namespace: str
    state_reachable: bool
    last_state_read_unix_s: float
    last_state_error: str
    snapshot_at_unix_s: float
    regions: int
    candidates: int
    healthy_regions: int
    fresh_carbon_zones: int
    active_streams: int
    version: str
    def __init__(self, energy_routing: _Optional[bool] = ..., policy: _Optional[str] = ..., state_backend: _Optional[str] = ..., namespace: _Optional[str] = ..., state_reachable: _Optional[bool] = ..., last_state_read_unix_s: _Optional[float] = ..., last_state_error: _Optional[str] = ..., snapshot_at_unix_s: _Optional[float] = ..., regions: _Optional[int] = ..., candidates: _Optional[int] = ..., healthy_regions: _Optional[int] = ..., fresh_carbon_zones: _Optional[int] = ..., active_streams: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...
