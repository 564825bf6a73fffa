"""The receipt a region writes itself for every dispatch with a ticket, on its engine's own
token counts: in direct mode no router sees the answer; in proxy mode the router books its
own receipt too, and the ledger keeps one entry per (decision, region, pool), on the
engine's counts where it has them (``scheduler.ledger.ledger``). A stream cut before its end
(the client or the router went away, cancelled, or the engine failed) is billed for what
the engine did: ``partial``, ``end_reason``, the prompt it prefilled and the tokens generated
so far; ``tokens_estimated`` when the engine could not count the prompt (it was gone).

The region signs the claims with its ticket key (purpose "receipt") and appends them to the
store's ``receipts`` stream; a router (``scheduler.server.region_receipts``) verifies the
signature before it books anything, so the ledger only holds what a region vouched for.
In direct mode the same claims travel, unsigned, in the stream's final event for the client.

Carbon is priced with the intensity the router signed into the ticket. When the router had
no usable signal (the ticket's intensity is None, or not a finite value within the physical
bounds of ``scheduler.signal_check``), the grams are a conservative bound, never
0: ``UPPER_BOUND_G_PER_KWH``, marked ``carbon_basis: "upper-bound"`` (as in
``scheduler.server.receipt``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# (the intensity a receipt books when no usable signal exists: no grid's average exceeds it, so
# the grams are an upper bound, not a guess)
from scheduler.signal_check import BOUNDS, UPPER_BOUND_G_PER_KWH
from scheduler.tickets import RegionKeys, Ticket, TicketRejected, sign, verify
from scheduler.types import CarbonUsed, EnergyReceipt, Signal

J_PER_KWH = 3.6e6
STREAM = "receipts"
STREAM_MAXLEN = 100_000


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


def receipt_claims(ticket: Ticket, *, pue: float, energy: Mapping[str, Any] | None,
                   usage: Mapping[str, int] | None, at: float, ttft_ms: float | None,
                   duration_ms: float, precision: str = "", end_reason: str = "complete",
                   tokens_estimated: bool = False) -> dict[str, Any]:
    """``precision``: of the weights the pool served the model at, from the region's config
    ("": not known). ``end_reason``: complete, cancelled (the client or the router went away)
    or region-error (the engine failed mid-stream)."""
    energy_j = number(energy.get("energy_j")) if energy else None
    intensity, basis = ticket.carbon_g_per_kwh, "signal"
    low, high = BOUNDS["carbon_intensity"]
    if intensity is None or not (math.isfinite(intensity) and low <= intensity <= high):
        intensity, basis = UPPER_BOUND_G_PER_KWH, "upper-bound"
    carbon_g = None if energy_j is None else energy_j / J_PER_KWH * intensity * pue
    return {
        "decision_id": ticket.decision_id,
        "request_id": ticket.request_id,
        "tenant": ticket.tenant,
        "region": ticket.region,
        "pool": ticket.pool,
        "model": ticket.model,
        "precision": precision,
        "workload_class": ticket.workload_class,
        "at": at,
        "pue": pue,
        "energy": dict(energy) if energy else None,
        "usage": dict(usage) if usage else None,
        "carbon_g": carbon_g,
        "carbon_basis": basis,
        "carbon_intensity_g_per_kwh": intensity,
        "carbon": None if ticket.carbon_g_per_kwh is None else {
            "zone": ticket.carbon_zone, "g_per_kwh": ticket.carbon_g_per_kwh,
            "observed_at": ticket.carbon_observed_at, "source": ticket.carbon_source,
        },
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "partial": end_reason != "complete",
        "end_reason": end_reason,
        "tokens_estimated": tokens_estimated,
    }


def sign_receipt(keys: RegionKeys, claims: Mapping[str, Any]) -> dict[str, str]:
    """The stream entry: the region (to pick its keys) and the signed claims."""
    return {"region": keys.region, "token": sign(keys, "receipt", claims)}


def verify_receipt(keys: RegionKeys, entry: Mapping[str, str]) -> dict[str, Any]:
    claims = verify(keys, "receipt", entry.get("token", ""))
    if claims.get("region") != keys.region:
        raise TicketRejected(401, f"receipt claims region {claims.get('region')!r} but is signed by {keys.region}")
    return claims


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
