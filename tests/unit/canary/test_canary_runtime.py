"""``CanaryRuntime`` over one store: counts in shared windows, a rollback every router sees, an
admin's re-enable, the arm off while the store cannot take the rollback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.canary.assign import CANARY, CONTROL
from scheduler.canary.runtime import OFF, ON, ROLLED_BACK, UNKNOWN, CanaryRuntime
from scheduler.canary.stats import Outcome
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import FleetConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.policy import Policy
from scheduler.state import keys
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import StateUnavailable
from scheduler.types import FleetSnapshot
from tests.canary_fixtures import write_policies

GOOD = Outcome(ttft_ok=True, error=False, retried=False, energy_j=10.0, carbon_g=0.2)
SLOW = Outcome(ttft_ok=False, error=False, retried=False, energy_j=12.0, carbon_g=0.1)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> FleetConfig:
    return load_checked_fleet(policies_dir=write_policies(Path(tmp_path_factory.mktemp("canary")) / "policies"))


def _policies(fleet: FleetConfig) -> dict[str, Policy]:
    return {name: compile_policy(policy) for name, policy in fleet.policies.items()}


def _snapshot(fleet: FleetConfig, runtime: CanaryRuntime) -> FleetSnapshot:
    policy = compile_policy(fleet.policy("steady"))
    regions = tuple(r for r in fleet.regions if r.name in ("eu-north", "us-east"))
    return runtime.attach(SnapshotBuilder(compile_fleet(regions), policy).build(1.0))


def _arm(snapshot: FleetSnapshot) -> FleetSnapshot:
    assert snapshot.canary is not None and snapshot.canary.snapshot is not None
    return snapshot.canary.snapshot


async def test_a_crossed_bound_rolls_the_arm_back_for_every_router(fleet: FleetConfig) -> None:
    store = MemoryStore()
    policy = compile_policy(fleet.policy("steady"))
    a, b = CanaryRuntime(store, _policies(fleet), host_id="a"), CanaryRuntime(store, _policies(fleet), host_id="b")
    # Before the first read the arm is off (the store may hold a rollback).
    before = _snapshot(fleet, a)
    assert before.canary is not None and not before.canary.enabled and before.canary_arm == CONTROL
    assert a.status(policy).state == UNKNOWN
    await a.refresh(policy)
    await b.refresh(policy)
    control = _snapshot(fleet, a)
    arm = _arm(control)
    assert control.canary is not None and control.canary.enabled and control.canary.epoch == "0"
    assert arm.policy.name == "thrifty" and arm.canary_arm == CANARY and arm.live_key is not control.live_key
    assert arm.policy.slo == policy.slo and arm.candidates is control.candidates

    # Both routers count into the same window: 8 canary streams miss the SLO, 8 control ones do not.
    for i in range(8):
        (a if i % 2 else b).observe(arm, SLOW)
        (a if i % 2 else b).observe(control, GOOD)
    await a.flush()
    await b.flush()
    await b.refresh(policy)  # b reads the window first and rolls back
    assert b.status(policy).state == ROLLED_BACK and b.rollbacks == 1
    await a.refresh(policy)
    status = a.status(policy)
    assert status.state == ROLLED_BACK and a.rollbacks == 0 and not status.enabled
    assert "TTFT-SLO attainment 0.0 % is below the floor of 80.0 %" in status.reason
    assert status.updated_by == "router@b"
    assert status.judged is not None and status.judged.canary.requests == 8 and status.judged.control.requests == 8
    after = _snapshot(fleet, a)
    assert after.canary is not None and not after.canary.enabled and after.canary.snapshot is None

    marker = json.loads(await store.get(keys.canary_rollback("steady", "thrifty", "0")) or b"{}")
    assert marker["metrics"] == ["ttft_slo_attainment"] and marker["by"] == "router@b"
    events = [body for _, body in await store.xrange(keys.AUDIT, 100) if body.get("event") == "canary-rollback"]
    assert len(events) == 1 and events[0]["policy"] == "steady" and events[0]["arm"] == "thrifty"
    assert "TTFT-SLO attainment" in events[0]["reason"]
    samples = {(name, tuple(sorted(labels.items()))): value for name, labels, value in a.samples()}
    assert samples[("scheduler_canary_enabled", (("candidate", "thrifty"), ("policy", "steady")))] == 0.0
    assert samples[("scheduler_canary_rolled_back", (("candidate", "thrifty"), ("policy", "steady")))] == 1.0

    # It stays off: later good traffic does not bring it back.
    for _ in range(20):
        a.observe(after, GOOD)
    await a.flush()
    await a.refresh(policy)
    assert a.status(policy).state == ROLLED_BACK

    # An admin re-enables it: a new epoch, empty windows, on for both routers.
    record = await a.set_arm(policy, True, "fixed", "ops@a")
    assert record.epoch != "0"
    await a.refresh(policy)
    await b.refresh(policy)
    assert a.status(policy).state == ON and b.status(policy).state == ON
    fresh = a.status(policy)
    assert fresh.epoch == record.epoch and fresh.judged is not None and fresh.judged.canary.requests == 0
    enabled = [body for _, body in await store.xrange(keys.AUDIT, 100) if body.get("event") == "canary-enable"]
    assert [e["reason"] for e in enabled] == ["fixed"]

    # And switches it off by hand.
    await b.set_arm(policy, False, "pausing", "ops@b")
    await a.refresh(policy)
    assert a.status(policy).state == OFF and a.status(policy).reason == "pausing"


async def test_the_arm_is_off_here_while_the_store_cannot_take_the_rollback(fleet: FleetConfig) -> None:
    store = MemoryStore()
    policy = compile_policy(fleet.policy("steady"))
    runtime = CanaryRuntime(store, _policies(fleet))
    await runtime.refresh(policy)
    arm = _arm(_snapshot(fleet, runtime))
    for _ in range(10):
        runtime.observe(arm, Outcome(ttft_ok=False, error=True, retried=True))
    await runtime.flush()

    async def refuse(*args: object, **kwargs: object) -> bool:
        raise StateUnavailable("down")

    store.set_nx = refuse  # type: ignore[method-assign]
    await runtime.refresh(policy)
    assert runtime.status(policy).state == ROLLED_BACK  # off on this router at once
    assert await store.get(keys.canary_rollback("steady", "thrifty", "0")) is None
    del store.set_nx  # the store takes it again: the next refresh writes the marker
    await runtime.refresh(policy)
    assert await store.get(keys.canary_rollback("steady", "thrifty", "0")) is not None
    assert runtime.rollbacks == 1 and runtime.status(policy).state == ROLLED_BACK


async def test_without_a_canary_nothing_changes(fleet: FleetConfig) -> None:
    runtime = CanaryRuntime(MemoryStore(), _policies(fleet))
    policy = compile_policy(fleet.policy("thrifty"))
    snapshot = SnapshotBuilder(compile_fleet(fleet.regions[:1]), policy).build(1.0)
    await runtime.refresh(policy)
    assert runtime.attach(snapshot) is snapshot
    assert not runtime.status(policy).configured


async def test_an_arm_that_is_not_loaded_stays_off(fleet: FleetConfig) -> None:
    runtime = CanaryRuntime(MemoryStore(), {"steady": compile_policy(fleet.policy("steady"))})
    policy = compile_policy(fleet.policy("steady"))
    await runtime.refresh(policy)
    snapshot = _snapshot(fleet, runtime)
    assert snapshot.canary is not None and not snapshot.canary.enabled
    runtime.use_policies(_policies(fleet))
    assert _snapshot(fleet, runtime).canary.enabled  # type: ignore[union-attr]


async def test_a_stream_without_a_first_token_by_its_budget_is_a_miss_then(fleet: FleetConfig) -> None:
    store = MemoryStore()
    policy = compile_policy(fleet.policy("steady"))
    now = [100.0]
    runtime = CanaryRuntime(store, _policies(fleet), monotonic=lambda: now[0])
    await runtime.refresh(policy)
    arm = _arm(_snapshot(fleet, runtime))
    text = {"hung": False, "quick": False}
    hung = runtime.begin(arm, 100.6, lambda: text["hung"])
    quick = runtime.begin(arm, 100.6, lambda: text["quick"])
    text["quick"] = True  # its first token came in time
    now[0] = 100.7
    assert runtime.sweep() == 1  # the hung one, counted at its budget
    await runtime.flush()
    await runtime.refresh(policy)
    figures = runtime.status(policy).judged
    assert figures is not None and figures.canary.ttft_n == 1 and figures.canary.ttft_ok == 0
    assert figures.canary.requests == 0  # the request itself counts when it ends
    # When they end: the hung one's verdict is not counted twice.
    runtime.observe(arm, Outcome(ttft_ok=False, error=True, retried=False), hung)
    runtime.observe(arm, Outcome(ttft_ok=True, error=False, retried=False), quick)
    await runtime.flush()
    await runtime.refresh(policy)
    figures = runtime.status(policy).judged
    assert figures is not None and (figures.canary.requests, figures.canary.ttft_n, figures.canary.ttft_ok) == (2, 2, 1)
    assert figures.canary.errors == 1
