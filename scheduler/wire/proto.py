"""The plain records (``scheduler.wire.records``) as protobuf messages: the receipt, the carbon
signal it rests on, a fallback, an output budget. The router sends them; in direct mode the SDK
builds the receipt from the region's claims with the same functions, so both modes answer with
the same message.
"""

from __future__ import annotations

from scheduler.energy.output_budget import OutputBudget
from scheduler.v1 import messages_pb2 as pb
from scheduler.wire.records import CarbonUsed, EnergyReceipt, Fallback


def fallback_to_proto(fallback: Fallback) -> pb.Fallback:
    message = pb.Fallback(signal=fallback.signal, scorer=fallback.scorer, max_age_s=fallback.max_age_s,
                          detail=fallback.detail, key=fallback.key, bound_unit=fallback.bound_unit,
                          candidates=fallback.candidates)
    if fallback.age_s is not None:
        message.age_s = fallback.age_s
    if fallback.bound is not None:
        message.bound = fallback.bound
    return message


def carbon_to_proto(used: CarbonUsed) -> pb.CarbonSignal:
    s = used.signal
    return pb.CarbonSignal(zone=s.key, value=s.value, unit=s.unit, observed_at_unix_s=s.observed_at,
                           source=s.source, age_s=used.age_s, stale=used.stale, signal_type=s.signal_type,
                           emission_factors=s.emission_factors, estimated=s.is_estimated,
                           estimation_method=s.estimation_method or "")


# Receipt fields that are optional in the proto: set only when something measured them.
_OPTIONAL_RECEIPT_FIELDS = (
    "energy_j", "energy_j_low", "energy_j_high", "confidence", "waiting_j", "prefill_j", "decode_j",
    "postprocess_j", "idle_allocation_j", "batch_size", "padding_ratio", "prompt_tokens", "completion_tokens",
    "reused_tokens", "avoided_j", "carbon_g", "ttft_ms", "carbon_intensity_g_per_kwh", "embodied_g",
)


def output_budget_to_proto(budget: OutputBudget) -> pb.OutputBudget:
    return pb.OutputBudget(
        requested_max_tokens=budget.requested_max_tokens, max_tokens=budget.max_tokens,
        quality_requested=budget.quality_requested, quality=budget.quality,
        energy_j_requested=budget.energy_j_requested, energy_j=budget.energy_j, mode=budget.mode,
        enforced=budget.enforced)


def receipt_to_proto(receipt: EnergyReceipt) -> pb.EnergyReceipt:
    message = pb.EnergyReceipt(
        measurement_source=receipt.measurement_source,
        attribution_method=receipt.attribution_method,
        pue=receipt.pue,
        region=receipt.region,
        pool=receipt.pool,
        decision_id=receipt.decision_id,
        request_id=receipt.request_id,
        model=receipt.model,
        duration_ms=receipt.duration_ms,
        fallbacks=[fallback_to_proto(f) for f in receipt.fallbacks],
        failovers=[pb.Failover(region=a.region, pool=a.pool, error=a.error, http_status=a.http_status)
                   for a in receipt.failovers],
        partial=receipt.partial,
        end_reason=receipt.end_reason,
        carbon_basis=receipt.carbon_basis,
        config_version=receipt.config_version,
        precision=receipt.precision,
        canary_arm=receipt.canary_arm,
        deferral=receipt.deferral,
        embodied_basis=receipt.embodied_basis,
        tickets_enforced=receipt.tickets_enforced,
    )
    for name in _OPTIONAL_RECEIPT_FIELDS:
        value = getattr(receipt, name)
        if value is not None:
            setattr(message, name, value)
    if receipt.released_at is not None:
        message.released_at_unix_s = receipt.released_at
    if receipt.carbon is not None:
        message.carbon_signal.CopyFrom(carbon_to_proto(receipt.carbon))
    if receipt.output_budget is not None:
        message.output_budget.CopyFrom(output_budget_to_proto(receipt.output_budget))
    return message
