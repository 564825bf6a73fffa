"""Which arm decides a request, and the snapshot it decides on.

A request's arm is a stable hash of its tenant or its request id (the canary's ``assign_by``):
the key's share in [0, 1) is the first 8 bytes of BLAKE2b(control/arm NUL key) over 2^64, and
the arm decides for the keys whose share is below the fraction. So the same key always gets
the same arm, raising the fraction keeps every key already on the arm there, and another
canary (another control or arm) splits the keys afresh.

``snapshot_for(request, snapshot)`` is a pure function of the two: the on/off state comes in
the snapshot (``FleetSnapshot.canary``, set by the refresher from the store), so a decision is
still a function of (request, snapshot) alone.
"""

from __future__ import annotations

import hashlib

from scheduler.types import CanarySplit, FleetSnapshot, Request

CONTROL = "control"
CANARY = "canary"
_SCALE = float(2**64)


def share(key: str, salt: str) -> float:
    """The key's place in [0, 1), stable across processes and releases."""
    digest = hashlib.blake2b(f"{salt}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def assignment_key(request: Request, split: CanarySplit) -> str:
    return request.tenant if split.assign_by == "tenant" else request.request_id


def assigned_arm(request: Request, split: CanarySplit) -> str:
    """The arm the request's key belongs to (whether that arm is on or not)."""
    if split.fraction <= 0.0:
        return CONTROL
    if split.fraction >= 1.0:
        return CANARY
    key = assignment_key(request, split)
    return CANARY if share(key, f"{split.control}/{split.arm}") < split.fraction else CONTROL


def snapshot_for(request: Request, snapshot: FleetSnapshot) -> FleetSnapshot:
    """The snapshot the request's arm decides on: the canary arm's while it is on and the
    request's key is in its fraction, else ``snapshot`` (the control's). The router's pending
    dispatches carry over (the arm's snapshot shares the control's candidates)."""
    split = snapshot.canary
    if split is None or snapshot.canary_arm != CONTROL or not split.enabled or split.snapshot is None:
        return snapshot
    if assigned_arm(request, split) != CANARY:
        return snapshot
    arm = split.snapshot
    return arm if snapshot.pending_wait_s is None else arm.with_pending(snapshot.pending_wait_s)
