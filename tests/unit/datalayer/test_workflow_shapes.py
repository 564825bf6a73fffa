"""Workflow shapes (docs/affinity.md, "Workflow shapes"): a fan-out's siblings sent within one
refresh interval follow the first one to its pool, until the home cannot meet a sibling's
deadline; a chain's step is never held. Decided by the shipped policies' real plugins on the
refresher's snapshots, with the router's own pending dispatches counted."""

from __future__ import annotations

import random

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.predict import request_view
from scheduler.framework.scheduler import Scheduler
from scheduler.framework.state import prepared, selected
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.filters.slo_reachable import TYPE as SLO_FILTER
from scheduler.plugins.scorers.affinity import AffinityScorer
from scheduler.state import codec, keys
from scheduler.state.memory_store import MemoryStore
from scheduler.types import Decision, Request
from tests.literals import NOW, carbon, pool, region

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

SHARED = 4096


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def twins(gpus: int) -> tuple[RegionConfig, ...]:
    """Two regions alike (same GPU, same grid intensity): only load and affinity tell them apart."""
    return (region("north", zone="N", pools=[pool("h200", "H200-141GB", count=gpus)]),
            region("west", zone="W", pools=[pool("h200", "H200-141GB", count=gpus)]))


async def refresher_for(regions: tuple[RegionConfig, ...], policy: PolicyConfig) -> SnapshotRefresher:
    store = MemoryStore(namespace="t")
    for config in regions:
        await store.set(keys.signal("carbon_intensity", config.carbon.zone),
                        codec.encode_signal(carbon(config.carbon.zone, 100)))
    refresher = SnapshotRefresher(SnapshotBuilder(compile_fleet(regions), compile_policy(policy)), store, clock=Clock())
    await refresher.refresh()
    return refresher


def sibling(i: int, workflow: str | None, ttft_slo_ms: float | None = None) -> Request:
    return Request(f"s{i}", "llama-3.1-8b", SHARED + 300, 128, workflow_id=workflow,
                   workflow_shape="fanout" if workflow else None, shared_prefix_tokens=SHARED,
                   prefix_key="sys-1", ttft_slo_ms=ttft_slo_ms)


def fan_out(refresher: SnapshotRefresher, n: int, workflow: str | None,
            ttft_slo_ms: float | None = None) -> list[Decision]:
    """Decide and dispatch n siblings back to back, with no refresh in between."""
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(7))
    decisions = []
    for i in range(n):
        request = sibling(i, workflow, ttft_slo_ms)
        snapshot = refresher.current()
        decision = scheduler.schedule(request, snapshot)
        refresher.record_dispatch(snapshot, decision.ranked_candidates[0], request)
        decisions.append(decision)
    return decisions


def places(decisions: list[Decision]) -> list[str]:
    return [d.ranked_candidates[0].key for d in decisions]


async def test_a_workflow_home_is_visible_to_the_next_request_without_a_refresh(default_policy) -> None:  # type: ignore[no-untyped-def]
    refresher = await refresher_for(twins(8), default_policy)
    before = refresher.current()
    west = next(c for c in before.candidates if c.region.name == "west")
    refresher.record_dispatch(before, west, sibling(0, "fan-1"))
    after = refresher.current()
    assert after.workflows["fan-1"].place == "west/h200"
    assert "fan-1" not in before.workflows  # a snapshot handed out never changes
    assert refresher.current() is after  # made once per dispatch, not per request
    assert (await refresher.refresh()).workflows["fan-1"].place == "west/h200"


@pytest.mark.parametrize("policy_name", ["default", "carbon-first"])
async def test_fan_out_siblings_go_to_one_pool_together(shipped, policy_name: str) -> None:  # type: ignore[no-untyped-def]
    policy = shipped.policy(policy_name)
    together = places(fan_out(await refresher_for(twins(8), policy), 8, "fan-1"))
    # Without a workflow the router's own pending dispatches spread them over the twins.
    spread = places(fan_out(await refresher_for(twins(8), policy), 8, None))
    print(f"\n{policy_name}: with a workflow {together}\n{policy_name}: without      {spread}")
    assert len(set(together)) == 1
    assert len(set(spread)) == 2


async def test_siblings_leave_the_home_only_when_it_cannot_meet_their_deadline(shipped) -> None:  # type: ignore[no-untyped-def]
    # One GPU per pool and an 800 ms TTFT SLO: the home's queue of siblings grows until the
    # SLO filter rejects it; the siblings after that go to the other pool (and stay together there).
    decisions = fan_out(await refresher_for(twins(1), shipped.policy("carbon-first")), 8, "fan-1", ttft_slo_ms=800)
    chosen = places(decisions)
    print(f"\n{chosen}")
    first = chosen[0]
    moved = next(i for i, place in enumerate(chosen) if place != first)
    assert moved >= 2, "siblings stayed together while the home met their deadline"
    assert all(place == first for place in chosen[:moved])
    assert any(r.plugin == SLO_FILTER and r.candidate.key == first for r in decisions[moved].rejected)
    assert all(place == chosen[moved] for place in chosen[moved:moved + 2])


async def test_the_shared_prefix_bounds_what_leaving_home_costs(shipped) -> None:  # type: ignore[no-untyped-def]
    refresher = await refresher_for(twins(8), shipped.policy("default"))
    snapshot = refresher.current()
    north = next(c for c in snapshot.candidates if c.region.name == "north")
    refresher.record_dispatch(snapshot, north, sibling(0, "fan-1"))
    snapshot = refresher.current()

    def lost_at_west(request: Request) -> float:
        base, _ = selected(ModelIndex(), request, snapshot)
        scorer = AffinityScorer()
        lost = scorer.score(request_view(request, snapshot, base), prepared(scorer, snapshot, base),
                            slice(None))
        by_key = dict(zip((snapshot.candidates[i].key for i in base), list(lost), strict=True))  # type: ignore[arg-type]
        assert by_key["north/h200"] == 0.0
        return float(by_key["west/h200"])

    fanout = lost_at_west(sibling(1, "fan-1"))
    chain_step = lost_at_west(Request("c1", "llama-3.1-8b", SHARED + 300, 128, workflow_id="fan-1",
                                      workflow_shape="chain", prefix_key="sys-1"))
    # A sibling shares the 4096-token system prompt only; a chain's step the whole last prompt.
    assert 0.0 < fanout < chain_step


async def test_a_chain_or_dag_step_is_never_held() -> None:
    base = Request("r", "llama-3.1-8b", 100, 16, workload_class="deferrable", workflow_id="w")
    assert Request("r", "llama-3.1-8b", 100, 16, workload_class="deferrable").holdable
    assert [Request("r", "llama-3.1-8b", 100, 16, workload_class="deferrable", workflow_id="w",
                    workflow_shape=shape).holdable for shape in ("chain", "fanout", "dag")] == [False, True, False]
    assert base.holdable
