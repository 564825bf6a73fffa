"""Which arm a request gets: a stable hash of its tenant or id, and the snapshot it decides on."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np

from scheduler.canary.assign import CANARY, CONTROL, assigned_arm, share, snapshot_for
from scheduler.types import CanarySplit, FleetSnapshot, Request

SPLIT = CanarySplit(control="steady", arm="thrifty", fraction=0.25, assign_by="request_id", enabled=True,
                    epoch="0", window_s=10.0)


def _request(request_id: str, tenant: str = "acme") -> Request:
    return Request(request_id=request_id, model="llama-3.1-8b", prompt_tokens=10, max_tokens=2, tenant=tenant)


def test_the_same_key_always_gets_the_same_arm() -> None:
    arms = {assigned_arm(_request("req-42"), SPLIT) for _ in range(100)}
    assert len(arms) == 1
    # Stable across processes (no per-process hash seed): another interpreter agrees.
    code = ("from scheduler.canary.assign import share; "
            "print(repr(share('req-42', 'steady/thrifty')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=".")
    assert float(other.stdout) == share("req-42", "steady/thrifty")


def test_the_fraction_of_keys_on_the_arm_is_the_fraction() -> None:
    on_arm = sum(assigned_arm(_request(f"r{i}"), SPLIT) == CANARY for i in range(20_000))
    assert abs(on_arm / 20_000 - 0.25) < 0.015


def test_raising_the_fraction_keeps_every_key_on_the_arm() -> None:
    wider = dataclasses.replace(SPLIT, fraction=0.5)
    ids = [f"r{i}" for i in range(5_000)]
    before = {i for i in ids if assigned_arm(_request(i), SPLIT) == CANARY}
    after = {i for i in ids if assigned_arm(_request(i), wider) == CANARY}
    assert before < after


def test_by_tenant_a_tenant_sees_one_arm() -> None:
    by_tenant = dataclasses.replace(SPLIT, assign_by="tenant", fraction=0.5)
    for tenant in ("acme", "globex", "initech", "umbrella", "hooli"):
        assert len({assigned_arm(_request(f"r{i}", tenant), by_tenant) for i in range(50)}) == 1
    tenants = [f"tenant-{i}" for i in range(2_000)]
    share_on = sum(assigned_arm(_request("same-id", t), by_tenant) == CANARY for t in tenants) / len(tenants)
    assert 0.45 < share_on < 0.55


def test_another_canary_splits_the_keys_afresh() -> None:
    other = dataclasses.replace(SPLIT, arm="frugal", fraction=0.5)
    mine = dataclasses.replace(SPLIT, fraction=0.5)
    ids = [f"r{i}" for i in range(4_000)]
    agree = sum(assigned_arm(_request(i), mine) == assigned_arm(_request(i), other) for i in ids) / len(ids)
    assert 0.45 < agree < 0.55  # independent halves agree on about half the keys


def test_fraction_zero_and_one() -> None:
    assert {assigned_arm(_request(f"r{i}"), dataclasses.replace(SPLIT, fraction=0.0)) for i in range(200)} == {CONTROL}
    assert {assigned_arm(_request(f"r{i}"), dataclasses.replace(SPLIT, fraction=1.0)) for i in range(200)} == {CANARY}


def _with(snapshot: FleetSnapshot, **changes: object) -> FleetSnapshot:
    copy = object.__new__(FleetSnapshot)
    copy.__dict__.update(snapshot.__dict__, **changes)
    return copy


def test_the_arms_snapshot_only_while_the_arm_is_on(make_snapshot, shipped) -> None:  # type: ignore[no-untyped-def]
    base = make_snapshot(shipped.regions[:2])
    arm_snapshot = _with(base, canary_arm=CANARY)
    split = dataclasses.replace(SPLIT, fraction=1.0, snapshot=arm_snapshot)
    control = _with(base, canary=split, canary_arm=CONTROL)
    assert snapshot_for(_request("r1"), control) is arm_snapshot
    off = _with(base, canary=dataclasses.replace(split, enabled=False), canary_arm=CONTROL)
    assert snapshot_for(_request("r1"), off) is off
    assert snapshot_for(_request("r1"), base) is base  # no canary
    none_assigned = _with(base, canary=dataclasses.replace(split, fraction=0.0), canary_arm=CONTROL)
    assert snapshot_for(_request("r1"), none_assigned) is none_assigned
    # The router's pending dispatches carry over to the arm's snapshot.
    pending = _with(control, pending_wait_s=np.zeros(len(base.candidates)))
    chosen = snapshot_for(_request("r1"), pending)
    assert chosen.canary_arm == CANARY and chosen.pending_wait_s is pending.pending_wait_s
