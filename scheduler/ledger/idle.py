"""Idle energy on the tenants' bills: warm GPUs that ran no request, shared by use.

A region's gateway meters every interval of each GPU; an interval with no request on its GPU is
idle and goes to the pool that holds the GPU (``scheduler.region.inflight``). The gateway adds
those joules up per pool and billing window (an hour by default), prices them at the grid
intensity the routers last signed into its tickets, counts the energy each tenant's requests
were billed on that pool in the same window, and signs one record per pool and window into the
``receipts`` stream (``scheduler.region.idle_windows``). The router that books the region's
receipts books the record here: each tenant that used the pool in the window gets its share of
the idle joules and grams,

    idle_j(tenant) = idle_j x used_j(tenant) / sum over tenants of used_j

as a ledger line of its own (rule ``idle``: it adds to the tenant's energy and carbon, not to its
requests). A window in which nobody used the pool is the operator's: it is booked to the tenant
``UNATTRIBUTED`` so the fleet's idle energy is on the books either way.

Each line is a ledger entry of its own (``idle-<gateway>-<window start>-<tenant digest>``), so
a record booked twice (an ingest that re-reads after a crash) counts once.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.ledger.ledger import ENGINE_COUNTED, LedgerEntry

KIND = "idle"
RULE = "idle"
UNATTRIBUTED = "_unattributed"


@dataclass(frozen=True, slots=True)
class IdleWindow:
    """One pool's idle energy in one billing window, as its region's gateway signed it."""

    region: str
    pool: str
    gateway: str  # the gateway instance that metered it (a restart starts another)
    window_start: float  # epoch seconds
    window_s: float
    idle_j: float
    carbon_g: float
    # Idle joules priced at the upper bound (no usable signal in the gateway's tickets yet).
    bounded_j: float
    used_j: Mapping[str, float]  # tenant -> joules its requests were billed on the pool

    def claims(self) -> dict[str, Any]:
        return {"kind": KIND, "region": self.region, "pool": self.pool, "gateway": self.gateway,
                "window_start": self.window_start, "window_s": self.window_s, "idle_j": self.idle_j,
                "carbon_g": self.carbon_g, "bounded_j": self.bounded_j, "used_j": dict(self.used_j)}

    @classmethod
    def from_claims(cls, claims: Mapping[str, Any]) -> IdleWindow:
        """The record a region signed; ``ValueError`` naming the field that is not what it must be."""
        used = claims.get("used_j")
        if not isinstance(used, dict):
            raise ValueError(f"idle record: used_j must be an object, got {used!r}")
        return cls(
            region=_text(claims, "region"), pool=_text(claims, "pool"), gateway=_text(claims, "gateway"),
            window_start=_amount(claims, "window_start"), window_s=_amount(claims, "window_s"),
            idle_j=_amount(claims, "idle_j"), carbon_g=_amount(claims, "carbon_g"),
            bounded_j=_amount(claims, "bounded_j"),
            used_j={str(tenant): _amount(used, tenant) for tenant in used},
        )

    def shares(self) -> dict[str, tuple[float, float]]:
        """tenant -> (idle J, idle gCO2e): in proportion to the joules each was billed on the
        pool in the window; all to ``UNATTRIBUTED`` when nobody used it."""
        used = {tenant: j for tenant, j in self.used_j.items() if j > 0.0}
        total = sum(used.values())
        if total <= 0.0:
            return {UNATTRIBUTED: (self.idle_j, self.carbon_g)}
        return {tenant: (self.idle_j * j / total, self.carbon_g * j / total) for tenant, j in used.items()}

    def entries(self) -> list[LedgerEntry]:
        """The ledger lines of this window, one per tenant."""
        end = self.window_start + self.window_s
        return [
            LedgerEntry(tenant=tenant, region=self.region, energy_j=energy_j, carbon_g=carbon_g, rule_version=RULE,
                        at=end, workload_class=KIND, decision_id=self._entry_id(tenant), pool=self.pool,
                        counted_by=ENGINE_COUNTED, requests=0.0)
            for tenant, (energy_j, carbon_g) in sorted(self.shares().items())
        ]

    def _entry_id(self, tenant: str) -> str:
        # No ':' in it (entry keys are decision:region:pool); the tenant hashed, as names may hold one.
        digest = hashlib.sha256(tenant.encode()).hexdigest()[:12]
        return f"idle-{self.gateway}-{self.window_start:.0f}-{digest}"


def _text(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"idle record: {name} must be a non-empty string, got {value!r}")
    return value


def _amount(claims: Mapping[str, Any], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"idle record: {name} must be a finite number >= 0, got {value!r}")
    return float(value)
