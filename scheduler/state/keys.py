"""The relative key names every component uses (the store adds ``sched:{namespace}:``)."""

from __future__ import annotations


def region_state(region: str) -> str:
    return f"region:{region}:state"


REGION_STATE_PREFIX = "region:"


def signal(kind: str, zone: str) -> str:
    return f"signal:{kind}:{zone}"


def forecast(kind: str, zone: str) -> str:
    return f"forecast:{kind}:{zone}"


def ledger(tenant: str, month: str) -> str:
    return f"ledger:{tenant}:{month}"


FLAGS = "flags"
AUDIT = "audit"


def lock(name: str) -> str:
    return f"lock:{name}"
