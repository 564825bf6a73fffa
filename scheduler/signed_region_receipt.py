"""The receipt a region writes itself for every dispatch with a ticket, on its engine's own
token counts: in direct mode no router sees the answer; in proxy mode the router books its
own receipt too, and the ledger keeps one entry per (decision, region, pool), on the
engine's counts where it has them (``scheduler.ledger.ledger``). A stream cut before its end
(the client or the router went away, cancelled, or the engine failed) is billed for what
the engine did: ``partial``, ``end_reason``, the prompt it prefilled and the tokens generated
so far; ``tokens_estimated`` when the engine could not count the prompt (it was gone).

The region signs the claims with its ticket key (purpose "receipt") and appends them to the
store's ``receipts`` stream; a router (``scheduler.server.region_receipt_ingest``) verifies the
signature before it books anything, so the ledger only holds what a region vouched for.
In direct mode the same claims travel, unsigned, in the stream's final event for the client.

Carbon is priced with the intensity the router signed into the ticket. When the router had
no usable signal (the ticket's intensity is None, or not a finite value within the physical
bounds of ``scheduler.signal_check``), the grams are a conservative bound, never
0: ``UPPER_BOUND_G_PER_KWH``, marked ``carbon_basis: "upper-bound"`` (as in
``scheduler.server.receipt_builder``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# (the intensity a receipt books when no usable signal exists: no grid's average exceeds it, so
# the grams are an upper bound, not a guess)
from scheduler.signal_check import BOUNDS, UPPER_BOUND_G_PER_KWH
from scheduler.tickets import RegionKeys, Ticket, TicketRejected, sign, verify
from scheduler.units import J_PER_KWH

# Reading claims is shared with the SDK (scheduler.wire); the router's receipt and ingest code
# import these from here.
from scheduler.wire.claims import RegionReceipt as RegionReceipt
from scheduler.wire.claims import energy_fields as energy_fields
from scheduler.wire.claims import number as number

STREAM = "receipts"
STREAM_MAXLEN = 100_000


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
