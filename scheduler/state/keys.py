"""The relative key names every component uses (the store adds ``sched:{namespace}:``)."""

from __future__ import annotations


def region_state(region: str) -> str:
    return f"region:{region}:state"


REGION_STATE_PREFIX = "region:"


def region_seen(region: str) -> str:
    """When the region last published (no TTL: outlives its expired state key)."""
    return f"region_seen:{region}"


def signal(kind: str, zone: str) -> str:
    return f"signal:{kind}:{zone}"


def forecast(kind: str, zone: str) -> str:
    return f"forecast:{kind}:{zone}"


def ledger(tenant: str, month: str) -> str:
    return f"ledger:{tenant}:{month}"


FLAGS = "flags"
AUDIT = "audit"


def audit_once(decision_id: str) -> str:
    """Marks a decision's audit entry as appended (a retried XADD lands once)."""
    return f"audit_once:{decision_id}"


def lock(name: str) -> str:
    return f"lock:{name}"
