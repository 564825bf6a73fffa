"""Reading a region's receipt claims (``scheduler.signed_region_receipt`` writes them): into the
``EnergyReceipt`` the ledger books, and the client's receipt in direct mode, where the claims
arrive, unsigned, in the stream's final event. Tolerant by design: a field the region did not
report, or reported as something other than a JSON number, stays None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.wire.records import CarbonUsed, EnergyReceipt, Signal


def number(value: object) -> float | None:
    """A JSON number as float; None for anything else (booleans included)."""
    kind = type(value)
    if kind is float or kind is int:  # what a JSON parser gives: decided without isinstance
        return float(value)  # type: ignore[arg-type]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def energy_fields(energy: Mapping[str, Any]) -> dict[str, Any]:
    """The ``EnergyReceipt`` fields in a region's ``energy`` object (the final stream event's
    extension), in either mode: what the region did not report stays None."""
    phases = _mapping(energy.get("phases"))
    return {
        "measurement_source": str(energy.get("measurement_source") or "unknown"),
        "attribution_method": str(energy.get("attribution_method") or ""),
        "energy_j": number(energy.get("energy_j")),
        "energy_j_low": number(energy.get("energy_j_low")),
        "energy_j_high": number(energy.get("energy_j_high")),
        "confidence": number(energy.get("confidence")),
        "waiting_j": number(phases.get("waiting_j")),
        "prefill_j": number(phases.get("prefill_j")),
        "decode_j": number(phases.get("decode_j")),
        "postprocess_j": number(phases.get("postprocess_j")),
        "idle_allocation_j": number(phases.get("idle_allocation_j")),
        "batch_size": number(energy.get("batch_size")),
        "padding_ratio": number(energy.get("padding_ratio")),
        "avoided_j": number(energy.get("avoided_j")),
    }


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}




@dataclass(frozen=True)
class RegionReceipt:
    claims: Mapping[str, Any]

    def energy_receipt(self) -> EnergyReceipt:
        claims = self.claims
        usage = _mapping(claims.get("usage"))
        carbon = claims.get("carbon")
        signal = None
        if isinstance(carbon, dict) and number(carbon.get("g_per_kwh")) is not None:
            observed = number(carbon.get("observed_at")) or 0.0
            at = number(claims.get("at")) or observed
            signal = CarbonUsed(
                Signal(kind="carbon_intensity", key=str(carbon.get("zone", "")), value=float(carbon["g_per_kwh"]),
                       unit="gCO2eq/kWh", observed_at=observed, fetched_at=observed,
                       source=str(carbon.get("source", ""))),
                age_s=max(0.0, at - observed), stale=False)
        return EnergyReceipt(
            decision_id=str(claims.get("decision_id", "")),
            request_id=str(claims.get("request_id", "")),
            tenant=str(claims.get("tenant", "")),
            model=str(claims.get("model", "")),
            region=str(claims.get("region", "")),
            pool=str(claims.get("pool", "")),
            precision=str(claims.get("precision") or ""),
            pue=number(claims.get("pue")) or 1.0,
            **energy_fields(_mapping(claims.get("energy"))),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            reused_tokens=_int(usage.get("cached_tokens")),
            carbon_g=number(claims.get("carbon_g")),
            carbon=signal,
            ttft_ms=number(claims.get("ttft_ms")),
            duration_ms=number(claims.get("duration_ms")) or 0.0,
            partial=claims.get("partial") is True,
            end_reason=str(claims.get("end_reason") or "complete"),
            tokens_estimated=claims.get("tokens_estimated") is True,
            carbon_basis=str(claims.get("carbon_basis") or ""),
            carbon_intensity_g_per_kwh=number(claims.get("carbon_intensity_g_per_kwh")),
        )
