from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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
    __slots__ = ("energy_routing", "policy", "state_backend", "namespace", "state_reachable", "last_state_read_unix_s", "last_state_error", "snapshot_at_unix_s", "regions", "candidates", "healthy_regions", "fresh_carbon_zones", "active_streams", "version", "config_version", "config_rejected", "config_last_rejection")
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
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_REJECTED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_LAST_REJECTION_FIELD_NUMBER: _ClassVar[int]
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
    config_version: str
    config_rejected: int
    config_last_rejection: str
    def __init__(self, energy_routing: _Optional[bool] = ..., policy: _Optional[str] = ..., state_backend: _Optional[str] = ..., namespace: _Optional[str] = ..., state_reachable: _Optional[bool] = ..., last_state_read_unix_s: _Optional[float] = ..., last_state_error: _Optional[str] = ..., snapshot_at_unix_s: _Optional[float] = ..., regions: _Optional[int] = ..., candidates: _Optional[int] = ..., healthy_regions: _Optional[int] = ..., fresh_carbon_zones: _Optional[int] = ..., active_streams: _Optional[int] = ..., version: _Optional[str] = ..., config_version: _Optional[str] = ..., config_rejected: _Optional[int] = ..., config_last_rejection: _Optional[str] = ...) -> None: ...

class GetCanaryStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CanaryArmStats(_message.Message):
    __slots__ = ("arm", "policy", "requests", "ttft_slo_attainment", "error_rate", "retry_rate", "energy_j_per_request", "gco2e_per_request")
    ARM_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    RETRY_RATE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    GCO2E_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    arm: str
    policy: str
    requests: int
    ttft_slo_attainment: float
    error_rate: float
    retry_rate: float
    energy_j_per_request: float
    gco2e_per_request: float
    def __init__(self, arm: _Optional[str] = ..., policy: _Optional[str] = ..., requests: _Optional[int] = ..., ttft_slo_attainment: _Optional[float] = ..., error_rate: _Optional[float] = ..., retry_rate: _Optional[float] = ..., energy_j_per_request: _Optional[float] = ..., gco2e_per_request: _Optional[float] = ...) -> None: ...

class CanaryWindow(_message.Message):
    __slots__ = ("start_unix_s", "length_s", "arms")
    START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LENGTH_S_FIELD_NUMBER: _ClassVar[int]
    ARMS_FIELD_NUMBER: _ClassVar[int]
    start_unix_s: float
    length_s: float
    arms: _containers.RepeatedCompositeFieldContainer[CanaryArmStats]
    def __init__(self, start_unix_s: _Optional[float] = ..., length_s: _Optional[float] = ..., arms: _Optional[_Iterable[_Union[CanaryArmStats, _Mapping]]] = ...) -> None: ...

class GetCanaryStatusResponse(_message.Message):
    __slots__ = ("configured", "policy", "arm", "fraction", "assign_by", "enabled", "state", "reason", "epoch", "updated_at_unix_s", "updated_by", "judged", "windows", "thresholds", "read_at_unix_s")
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_BY_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    JUDGED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    READ_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    configured: bool
    policy: str
    arm: str
    fraction: float
    assign_by: str
    enabled: bool
    state: str
    reason: str
    epoch: str
    updated_at_unix_s: float
    updated_by: str
    judged: CanaryWindow
    windows: _containers.RepeatedCompositeFieldContainer[CanaryWindow]
    thresholds: _containers.RepeatedScalarFieldContainer[str]
    read_at_unix_s: float
    def __init__(self, configured: _Optional[bool] = ..., policy: _Optional[str] = ..., arm: _Optional[str] = ..., fraction: _Optional[float] = ..., assign_by: _Optional[str] = ..., enabled: _Optional[bool] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., epoch: _Optional[str] = ..., updated_at_unix_s: _Optional[float] = ..., updated_by: _Optional[str] = ..., judged: _Optional[_Union[CanaryWindow, _Mapping]] = ..., windows: _Optional[_Iterable[_Union[CanaryWindow, _Mapping]]] = ..., thresholds: _Optional[_Iterable[str]] = ..., read_at_unix_s: _Optional[float] = ...) -> None: ...

class SetCanaryArmRequest(_message.Message):
    __slots__ = ("enabled", "reason")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    reason: str
    def __init__(self, enabled: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SetCanaryArmResponse(_message.Message):
    __slots__ = ("enabled", "epoch", "updated_at_unix_s", "updated_by", "policy", "arm")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    epoch: str
    updated_at_unix_s: float
    updated_by: str
    policy: str
    arm: str
    def __init__(self, enabled: _Optional[bool] = ..., epoch: _Optional[str] = ..., updated_at_unix_s: _Optional[float] = ..., updated_by: _Optional[str] = ..., policy: _Optional[str] = ..., arm: _Optional[str] = ...) -> None: ...

class ReloadConfigRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class ConfigProblem(_message.Message):
    __slots__ = ("file", "field", "message")
    FILE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    file: str
    field: str
    message: str
    def __init__(self, file: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ReloadConfigResponse(_message.Message):
    __slots__ = ("ok", "changed", "version", "previous_version", "files_digest", "problems", "published", "publish_error", "source")
    OK_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    FILES_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ERROR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    changed: bool
    version: str
    previous_version: str
    files_digest: str
    problems: _containers.RepeatedCompositeFieldContainer[ConfigProblem]
    published: bool
    publish_error: str
    source: str
    def __init__(self, ok: _Optional[bool] = ..., changed: _Optional[bool] = ..., version: _Optional[str] = ..., previous_version: _Optional[str] = ..., files_digest: _Optional[str] = ..., problems: _Optional[_Iterable[_Union[ConfigProblem, _Mapping]]] = ..., published: _Optional[bool] = ..., publish_error: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...
