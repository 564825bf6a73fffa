"""The relative key names every component uses (the store adds ``sched:{namespace}:``)."""

from __future__ import annotations


def region_state(region: str) -> str:
    return f"region:{region}:state"


REGION_STATE_PREFIX = "region:"


def region_seen(region: str) -> str:
    """When the region last published (kept 30 days: outlives its expired state key)."""
    return f"region_seen:{region}"


def prefix_warm(region: str) -> str:
    """The prefix keys the region's pools served with prefix-cache hits (with a TTL;
    scheduler.state.prefix_warm)."""
    return f"prefix_warm:{region}"


def signal(kind: str, zone: str) -> str:
    return f"signal:{kind}:{zone}"


def forecast(kind: str, zone: str) -> str:
    return f"forecast:{kind}:{zone}"


def signal_daily_max(kind: str, zone: str) -> str:
    """The zone's highest accepted value per UTC day, the last few weeks (with a TTL): what a
    candidate whose zone signal is unusable is priced at (scheduler.datalayer.carbon.store_io)."""
    return f"signal_max:{kind}:{zone}"


def ledger(tenant: str, month: str) -> str:
    return f"ledger:{tenant}:{month}"


FLAGS = "flags"
AUDIT = "audit"


def audit_once(entry: str) -> str:
    """Marks an audit entry as appended (a retried XADD lands once); ``entry`` names it (a
    receipt's "{decision_id}:{region}:{pool}", a canary event's own name)."""
    return f"audit_once:{entry}"


def lock(name: str) -> str:
    return f"lock:{name}"


def canary(policy: str) -> str:
    """A policy's canary record: an admin's on/off and the epoch its windows are counted in
    (scheduler.canary; absent: on, epoch "0")."""
    return f"canary:{policy}"


def canary_rollback(policy: str, arm: str, epoch: str) -> str:
    """Set once when the arm of ``policy``'s canary rolls back in ``epoch`` (no expiry to speak
    of: it stays off until an admin re-enables it, which starts another epoch)."""
    return f"canary_rollback:{policy}:{arm}:{epoch}"


def canary_window(policy: str, arm: str, epoch: str, window_s: float, index: int) -> str:
    """The counts of both arms of ``policy``'s canary in one window (a hash that expires)."""
    return f"canary_window:{policy}:{arm}:{epoch}:{window_s:g}s:{index}"


def canary_once(batch: str) -> str:
    """Marks a batch of canary counts as added (a retried write counts once)."""
    return f"canary_once:{batch}"
