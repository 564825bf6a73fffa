from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_CLASS_UNSPECIFIED: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_INTERACTIVE: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_BATCH: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_DEFERRABLE: _ClassVar[WorkloadClass]

class WorkflowShape(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKFLOW_SHAPE_UNSPECIFIED: _ClassVar[WorkflowShape]
    WORKFLOW_SHAPE_CHAIN: _ClassVar[WorkflowShape]
    WORKFLOW_SHAPE_FANOUT: _ClassVar[WorkflowShape]
    WORKFLOW_SHAPE_DAG: _ClassVar[WorkflowShape]

class DecisionDetail(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_DETAIL_UNSPECIFIED: _ClassVar[DecisionDetail]
    DECISION_DETAIL_FULL: _ClassVar[DecisionDetail]
    DECISION_DETAIL_SUMMARY: _ClassVar[DecisionDetail]
WORKLOAD_CLASS_UNSPECIFIED: WorkloadClass
WORKLOAD_CLASS_INTERACTIVE: WorkloadClass
WORKLOAD_CLASS_BATCH: WorkloadClass
WORKLOAD_CLASS_DEFERRABLE: WorkloadClass
WORKFLOW_SHAPE_UNSPECIFIED: WorkflowShape
WORKFLOW_SHAPE_CHAIN: WorkflowShape
WORKFLOW_SHAPE_FANOUT: WorkflowShape
WORKFLOW_SHAPE_DAG: WorkflowShape
DECISION_DETAIL_UNSPECIFIED: DecisionDetail
DECISION_DETAIL_FULL: DecisionDetail
DECISION_DETAIL_SUMMARY: DecisionDetail

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_call_id", "tool_calls_json")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    tool_call_id: str
    tool_calls_json: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls_json: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "stop", "seed")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class Slo(_message.Message):
    __slots__ = ("ttft_ms", "tpot_ms")
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    ttft_ms: float
    tpot_ms: float
    def __init__(self, ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ...) -> None: ...

class Compliance(_message.Message):
    __slots__ = ("allowed_jurisdictions", "required_certifications", "precision", "task_class")
    ALLOWED_JURISDICTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_CERTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TASK_CLASS_FIELD_NUMBER: _ClassVar[int]
    allowed_jurisdictions: _containers.RepeatedScalarFieldContainer[str]
    required_certifications: _containers.RepeatedScalarFieldContainer[str]
    precision: str
    task_class: str
    def __init__(self, allowed_jurisdictions: _Optional[_Iterable[str]] = ..., required_certifications: _Optional[_Iterable[str]] = ..., precision: _Optional[str] = ..., task_class: _Optional[str] = ...) -> None: ...

class GeoPoint(_message.Message):
    __slots__ = ("lat", "lon")
    LAT_FIELD_NUMBER: _ClassVar[int]
    LON_FIELD_NUMBER: _ClassVar[int]
    lat: float
    lon: float
    def __init__(self, lat: _Optional[float] = ..., lon: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("tenant", "request_id", "model", "prompt", "chat", "sampling", "workload_class", "slo", "compliance", "client_location", "prefix_key", "prompt_tokens", "cached_tokens", "decision_detail", "workflow_id", "workflow_shape", "shared_prefix_tokens", "engine_fields_json")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    COMPLIANCE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_LOCATION_FIELD_NUMBER: _ClassVar[int]
    PREFIX_KEY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECISION_DETAIL_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_SHAPE_FIELD_NUMBER: _ClassVar[int]
    SHARED_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELDS_JSON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    request_id: str
    model: str
    prompt: str
    chat: ChatMessages
    sampling: SamplingParams
    workload_class: WorkloadClass
    slo: Slo
    compliance: Compliance
    client_location: GeoPoint
    prefix_key: str
    prompt_tokens: int
    cached_tokens: int
    decision_detail: DecisionDetail
    workflow_id: str
    workflow_shape: WorkflowShape
    shared_prefix_tokens: int
    engine_fields_json: str
    def __init__(self, tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., workload_class: _Optional[_Union[WorkloadClass, str]] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., compliance: _Optional[_Union[Compliance, _Mapping]] = ..., client_location: _Optional[_Union[GeoPoint, _Mapping]] = ..., prefix_key: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., decision_detail: _Optional[_Union[DecisionDetail, str]] = ..., workflow_id: _Optional[str] = ..., workflow_shape: _Optional[_Union[WorkflowShape, str]] = ..., shared_prefix_tokens: _Optional[int] = ..., engine_fields_json: _Optional[str] = ...) -> None: ...

class EnergyEstimate(_message.Message):
    __slots__ = ("energy_j", "energy_j_low", "energy_j_high", "prefill_j", "decode_j", "idle_j", "provenance")
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_LOW_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_HIGH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_J_FIELD_NUMBER: _ClassVar[int]
    DECODE_J_FIELD_NUMBER: _ClassVar[int]
    IDLE_J_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    energy_j: float
    energy_j_low: float
    energy_j_high: float
    prefill_j: float
    decode_j: float
    idle_j: float
    provenance: str
    def __init__(self, energy_j: _Optional[float] = ..., energy_j_low: _Optional[float] = ..., energy_j_high: _Optional[float] = ..., prefill_j: _Optional[float] = ..., decode_j: _Optional[float] = ..., idle_j: _Optional[float] = ..., provenance: _Optional[str] = ...) -> None: ...

class RankedCandidate(_message.Message):
    __slots__ = ("region", "pool", "model", "gpu", "endpoint", "quantities", "costs", "total", "energy", "precision", "tickets_enforced")
    class QuantitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class CostsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REGION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    QUANTITIES_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TICKETS_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    region: str
    pool: str
    model: str
    gpu: str
    endpoint: str
    quantities: _containers.ScalarMap[str, float]
    costs: _containers.ScalarMap[str, float]
    total: float
    energy: EnergyEstimate
    precision: str
    tickets_enforced: bool
    def __init__(self, region: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., endpoint: _Optional[str] = ..., quantities: _Optional[_Mapping[str, float]] = ..., costs: _Optional[_Mapping[str, float]] = ..., total: _Optional[float] = ..., energy: _Optional[_Union[EnergyEstimate, _Mapping]] = ..., precision: _Optional[str] = ..., tickets_enforced: _Optional[bool] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("region", "pool", "plugin", "reason")
    REGION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    region: str
    pool: str
    plugin: str
    reason: str
    def __init__(self, region: _Optional[str] = ..., pool: _Optional[str] = ..., plugin: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Fallback(_message.Message):
    __slots__ = ("signal", "scorer", "age_s", "max_age_s", "detail", "key", "bound", "bound_unit", "candidates")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    BOUND_UNIT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    signal: str
    scorer: str
    age_s: float
    max_age_s: float
    detail: str
    key: str
    bound: float
    bound_unit: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, signal: _Optional[str] = ..., scorer: _Optional[str] = ..., age_s: _Optional[float] = ..., max_age_s: _Optional[float] = ..., detail: _Optional[str] = ..., key: _Optional[str] = ..., bound: _Optional[float] = ..., bound_unit: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("decision_id", "request_id", "decided_at_unix_s", "policy", "ranked", "rejected", "fallbacks", "rates", "units", "objective", "energy_ranking", "plugin_timings_ns", "prompt_tokens", "prompt_tokens_estimated", "ranked_total", "rejected_total", "config_version", "canary_arm", "output_budget", "deferred_until_unix_s", "deferral")
    class RatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UnitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PluginTimingsNsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RANKED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_RANKING_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_TIMINGS_NS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    RANKED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_ARM_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEFERRAL_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    request_id: str
    decided_at_unix_s: float
    policy: str
    ranked: _containers.RepeatedCompositeFieldContainer[RankedCandidate]
    rejected: _containers.RepeatedCompositeFieldContainer[Rejection]
    fallbacks: _containers.RepeatedCompositeFieldContainer[Fallback]
    rates: _containers.ScalarMap[str, float]
    units: _containers.ScalarMap[str, str]
    objective: str
    energy_ranking: bool
    plugin_timings_ns: _containers.ScalarMap[str, int]
    prompt_tokens: int
    prompt_tokens_estimated: bool
    ranked_total: int
    rejected_total: int
    config_version: str
    canary_arm: str
    output_budget: OutputBudget
    deferred_until_unix_s: float
    deferral: str
    def __init__(self, decision_id: _Optional[str] = ..., request_id: _Optional[str] = ..., decided_at_unix_s: _Optional[float] = ..., policy: _Optional[str] = ..., ranked: _Optional[_Iterable[_Union[RankedCandidate, _Mapping]]] = ..., rejected: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., fallbacks: _Optional[_Iterable[_Union[Fallback, _Mapping]]] = ..., rates: _Optional[_Mapping[str, float]] = ..., units: _Optional[_Mapping[str, str]] = ..., objective: _Optional[str] = ..., energy_ranking: _Optional[bool] = ..., plugin_timings_ns: _Optional[_Mapping[str, int]] = ..., prompt_tokens: _Optional[int] = ..., prompt_tokens_estimated: _Optional[bool] = ..., ranked_total: _Optional[int] = ..., rejected_total: _Optional[int] = ..., config_version: _Optional[str] = ..., canary_arm: _Optional[str] = ..., output_budget: _Optional[_Union[OutputBudget, _Mapping]] = ..., deferred_until_unix_s: _Optional[float] = ..., deferral: _Optional[str] = ...) -> None: ...

class OutputBudget(_message.Message):
    __slots__ = ("requested_max_tokens", "max_tokens", "quality_requested", "quality", "energy_j_requested", "energy_j", "mode", "enforced")
    REQUESTED_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUALITY_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_FIELD_NUMBER: _ClassVar[int]
    requested_max_tokens: int
    max_tokens: int
    quality_requested: float
    quality: float
    energy_j_requested: float
    energy_j: float
    mode: str
    enforced: bool
    def __init__(self, requested_max_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., quality_requested: _Optional[float] = ..., quality: _Optional[float] = ..., energy_j_requested: _Optional[float] = ..., energy_j: _Optional[float] = ..., mode: _Optional[str] = ..., enforced: _Optional[bool] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("text", "finish_reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    finish_reason: str
    def __init__(self, text: _Optional[str] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class CarbonSignal(_message.Message):
    __slots__ = ("zone", "value", "unit", "observed_at_unix_s", "source", "age_s", "stale", "signal_type", "emission_factors", "estimated", "estimation_method")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    EMISSION_FACTORS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATION_METHOD_FIELD_NUMBER: _ClassVar[int]
    zone: str
    value: float
    unit: str
    observed_at_unix_s: float
    source: str
    age_s: float
    stale: bool
    signal_type: str
    emission_factors: str
    estimated: bool
    estimation_method: str
    def __init__(self, zone: _Optional[str] = ..., value: _Optional[float] = ..., unit: _Optional[str] = ..., observed_at_unix_s: _Optional[float] = ..., source: _Optional[str] = ..., age_s: _Optional[float] = ..., stale: _Optional[bool] = ..., signal_type: _Optional[str] = ..., emission_factors: _Optional[str] = ..., estimated: _Optional[bool] = ..., estimation_method: _Optional[str] = ...) -> None: ...

class Failover(_message.Message):
    __slots__ = ("region", "pool", "error", "http_status")
    REGION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    region: str
    pool: str
    error: str
    http_status: int
    def __init__(self, region: _Optional[str] = ..., pool: _Optional[str] = ..., error: _Optional[str] = ..., http_status: _Optional[int] = ...) -> None: ...

class EnergyReceipt(_message.Message):
    __slots__ = ("energy_j", "energy_j_low", "energy_j_high", "measurement_source", "confidence", "attribution_method", "waiting_j", "prefill_j", "decode_j", "postprocess_j", "idle_allocation_j", "batch_size", "padding_ratio", "prompt_tokens", "completion_tokens", "reused_tokens", "avoided_j", "carbon_g", "carbon_signal", "pue", "region", "pool", "decision_id", "fallbacks", "failovers", "model", "request_id", "ttft_ms", "duration_ms", "partial", "end_reason", "carbon_basis", "carbon_intensity_g_per_kwh", "config_version", "canary_arm", "precision", "output_budget", "released_at_unix_s", "deferral", "embodied_g", "embodied_basis", "tickets_enforced")
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_LOW_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_HIGH_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_METHOD_FIELD_NUMBER: _ClassVar[int]
    WAITING_J_FIELD_NUMBER: _ClassVar[int]
    PREFILL_J_FIELD_NUMBER: _ClassVar[int]
    DECODE_J_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_J_FIELD_NUMBER: _ClassVar[int]
    IDLE_ALLOCATION_J_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PADDING_RATIO_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AVOIDED_J_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_FIELD_NUMBER: _ClassVar[int]
    CARBON_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    CARBON_BASIS_FIELD_NUMBER: _ClassVar[int]
    CARBON_INTENSITY_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_ARM_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEFERRAL_FIELD_NUMBER: _ClassVar[int]
    EMBODIED_G_FIELD_NUMBER: _ClassVar[int]
    EMBODIED_BASIS_FIELD_NUMBER: _ClassVar[int]
    TICKETS_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    energy_j: float
    energy_j_low: float
    energy_j_high: float
    measurement_source: str
    confidence: float
    attribution_method: str
    waiting_j: float
    prefill_j: float
    decode_j: float
    postprocess_j: float
    idle_allocation_j: float
    batch_size: float
    padding_ratio: float
    prompt_tokens: int
    completion_tokens: int
    reused_tokens: int
    avoided_j: float
    carbon_g: float
    carbon_signal: CarbonSignal
    pue: float
    region: str
    pool: str
    decision_id: str
    fallbacks: _containers.RepeatedCompositeFieldContainer[Fallback]
    failovers: _containers.RepeatedCompositeFieldContainer[Failover]
    model: str
    request_id: str
    ttft_ms: float
    duration_ms: float
    partial: bool
    end_reason: str
    carbon_basis: str
    carbon_intensity_g_per_kwh: float
    config_version: str
    canary_arm: str
    precision: str
    output_budget: OutputBudget
    released_at_unix_s: float
    deferral: str
    embodied_g: float
    embodied_basis: str
    tickets_enforced: bool
    def __init__(self, energy_j: _Optional[float] = ..., energy_j_low: _Optional[float] = ..., energy_j_high: _Optional[float] = ..., measurement_source: _Optional[str] = ..., confidence: _Optional[float] = ..., attribution_method: _Optional[str] = ..., waiting_j: _Optional[float] = ..., prefill_j: _Optional[float] = ..., decode_j: _Optional[float] = ..., postprocess_j: _Optional[float] = ..., idle_allocation_j: _Optional[float] = ..., batch_size: _Optional[float] = ..., padding_ratio: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., avoided_j: _Optional[float] = ..., carbon_g: _Optional[float] = ..., carbon_signal: _Optional[_Union[CarbonSignal, _Mapping]] = ..., pue: _Optional[float] = ..., region: _Optional[str] = ..., pool: _Optional[str] = ..., decision_id: _Optional[str] = ..., fallbacks: _Optional[_Iterable[_Union[Fallback, _Mapping]]] = ..., failovers: _Optional[_Iterable[_Union[Failover, _Mapping]]] = ..., model: _Optional[str] = ..., request_id: _Optional[str] = ..., ttft_ms: _Optional[float] = ..., duration_ms: _Optional[float] = ..., partial: _Optional[bool] = ..., end_reason: _Optional[str] = ..., carbon_basis: _Optional[str] = ..., carbon_intensity_g_per_kwh: _Optional[float] = ..., config_version: _Optional[str] = ..., canary_arm: _Optional[str] = ..., precision: _Optional[str] = ..., output_budget: _Optional[_Union[OutputBudget, _Mapping]] = ..., released_at_unix_s: _Optional[float] = ..., deferral: _Optional[str] = ..., embodied_g: _Optional[float] = ..., embodied_basis: _Optional[str] = ..., tickets_enforced: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("decision", "chunk", "receipt")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    chunk: TokenChunk
    receipt: EnergyReceipt
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., receipt: _Optional[_Union[EnergyReceipt, _Mapping]] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("name", "gpu", "count", "models")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu: str
    count: int
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., gpu: _Optional[str] = ..., count: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class RegionInfo(_message.Message):
    __slots__ = ("name", "jurisdiction", "certifications", "grid_zone", "pue", "endpoint", "location", "pools", "healthy", "state_age_s", "carbon", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    JURISDICTION_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    GRID_ZONE_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    CARBON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    jurisdiction: str
    certifications: _containers.RepeatedScalarFieldContainer[str]
    grid_zone: str
    pue: float
    endpoint: str
    location: GeoPoint
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    healthy: bool
    state_age_s: float
    carbon: CarbonSignal
    kind: str
    def __init__(self, name: _Optional[str] = ..., jurisdiction: _Optional[str] = ..., certifications: _Optional[_Iterable[str]] = ..., grid_zone: _Optional[str] = ..., pue: _Optional[float] = ..., endpoint: _Optional[str] = ..., location: _Optional[_Union[GeoPoint, _Mapping]] = ..., pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ..., healthy: _Optional[bool] = ..., state_age_s: _Optional[float] = ..., carbon: _Optional[_Union[CarbonSignal, _Mapping]] = ..., kind: _Optional[str] = ...) -> None: ...
