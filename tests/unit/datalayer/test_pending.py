"""The router's own dispatches between two live-state refreshes: counted per pool, spread over
its replicas, settled by the region's next state, and seen by the next decisions (no herding)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.datalayer.pending import PendingDispatches, prefill_s
from scheduler.testing import T0, live_state, pool, region, request, scheduler, snapshot
from scheduler.types import FleetSnapshot, PoolLiveState


def two_pools() -> FleetSnapshot:
    return snapshot(
        region("clean", carbon=20, lat=40.7, lon=-74.0,
               pools=[pool("small", count=2, models=("llama-3.1-8b", "llama-3.2-1b")), pool("big", count=4)]),
        region("dirty", carbon=700, lat=40.7, lon=-74.0, pools=[pool("big", count=64)]),
        live={"clean": live_state("clean", T0), "dirty": live_state("dirty", T0)},
    )


def test_a_dispatch_adds_its_prefill_over_the_replicas_to_its_pool_only() -> None:
    snap = two_pools()
    pending = PendingDispatches()
    small = next(c for c in snap.candidates if c.key == "clean/small" and c.deployment.name == "llama-3.1-8b")
    req = request(prompt_tokens=4000)
    before = pending.apply(snap)
    assert before is snap and snap.pending_wait_s is None
    pending.record(snap, small, req, at=T0 + 0.1)
    after = pending.apply(snap)
    assert after.pending_wait_s is not None
    expected = prefill_s(snap, small, req) / 2  # two replicas share it
    by_key = {(c.key, c.deployment.name): float(after.pending_wait_s[c.index]) for c in snap.candidates}
    assert by_key[("clean/small", "llama-3.1-8b")] == pytest.approx(expected)
    assert by_key[("clean/small", "llama-3.2-1b")] == pytest.approx(expected)  # same pool, same replicas
    assert by_key[("clean/big", "llama-3.1-8b")] == 0 and by_key[("dirty/big", "llama-3.1-8b")] == 0
    # A snapshot handed out keeps its numbers when more dispatches come.
    kept = after.pending_wait_s.copy()
    pending.record(snap, small, req, at=T0 + 0.2)
    assert np.array_equal(after.pending_wait_s, kept)
    assert pending.apply(snap).pending_wait_s[small.index] == pytest.approx(2 * expected)
    # Everything but the pending wait is shared, the inputs' key and delta included.
    assert after.live_key is snap.live_key and after.delta is snap.delta


def test_the_regions_next_state_settles_what_it_shows() -> None:
    snap = two_pools()
    pending = PendingDispatches()
    small = next(c for c in snap.candidates if c.key == "clean/small")
    pending.record(snap, small, request(), at=T0 + 1.0)
    pending.record(snap, small, request(), at=T0 + 3.0)
    pending.settle({"clean": live_state("clean", T0 + 2.0)})
    one = prefill_s(snap, small, request()) / 2
    assert pending.apply(snap).pending_wait_s[small.index] == pytest.approx(one)
    pending.settle({"dirty": live_state("dirty", T0 + 9.0)})  # another region's state settles nothing here
    assert pending.apply(snap).pending_wait_s[small.index] == pytest.approx(one)
    pending.settle({}, now=T0 + 3.0 + pending.horizon_s + 0.1)  # a region that stopped publishing
    assert pending.apply(snap) is snap


def test_pending_dispatches_stop_the_herd_on_the_cheapest_pool() -> None:
    snap = two_pools()
    decide = scheduler()
    pending = PendingDispatches()
    chosen = []
    for i in range(400):
        current = pending.apply(snap)
        req = request(prompt_tokens=2000, request_id=f"r{i}", client=(40.7, -74.0))
        decision = decide.schedule(req, current)
        first = decision.ranked_candidates[0]
        chosen.append(first.key)
        pending.record(current, first, req, at=T0 + i * 0.001)
    # The clean region takes what its pools can start within the SLO, then the rest spills.
    assert chosen[0].startswith("clean/")
    assert "dirty/big" in chosen
    clean_share = sum(k.startswith("clean/") for k in chosen) / len(chosen)
    assert 0 < clean_share < 1


def test_busy_live_state_predicts_a_queue() -> None:
    state = PoolLiveState(queue_depth=40, running=512, kv_cache_usage=0.97)
    busy = {"clean": live_state("clean", T0, {"small": state})}
    snap = snapshot(region("clean", pools=[pool("small", count=2)]), live=busy)
    assert snap.perf[0].queue_wait_s > 1.0
    idle = snapshot(region("clean", pools=[pool("small", count=2)]), live={"clean": live_state("clean", T0)})
    assert idle.perf[0].queue_wait_s == 0.0


def test_a_candidate_at_an_index_another_fleet_had_counts_to_its_own_pool() -> None:
    """A dispatch counts to the pool of the candidate it went to (its key and replicas), never
    to another fleet's candidate at the same index."""
    first = two_pools()
    other = snapshot(
        region("dirty", carbon=700, lat=40.7, lon=-74.0, pools=[pool("big", count=64)]),
        region("clean", carbon=20, lat=40.7, lon=-74.0, pools=[pool("small", count=2)]),
        live={"clean": live_state("clean", T0), "dirty": live_state("dirty", T0)},
    )
    pending = PendingDispatches()
    a = first.candidates[0]
    b = other.candidates[0]
    assert a.index == b.index and a.key != b.key
    req = request(prompt_tokens=4000)
    pending.record(first, a, req, at=T0 + 0.1)
    pending.record(other, b, req, at=T0 + 0.2)
    applied = pending.apply(other).pending_wait_s
    assert applied is not None
    assert applied[b.index] == pytest.approx(prefill_s(other, b, req) / 64)
    small = next(c for c in other.candidates if c.key == "clean/small")
    assert applied[small.index] == pytest.approx(prefill_s(first, a, req) / 2)
