"""Prefix and workflow affinity in the simulator: what the data layer publishes
(scheduler.sim.datalayer.SimAffinity), the pools' prefix-aware replica choice
(scheduler.sim.pools), and fan-outs, chains and deadlines on small fleets (scheduler.sim.engine)."""

from __future__ import annotations

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.step import StepCosts
from scheduler.sim.datalayer import SimAffinity
from scheduler.sim.deferral import Deferral
from scheduler.sim.pools import PoolSim
from scheduler.sim.replica import PrefixCache, Seq
from scheduler.types import Request
from tests.unit.sim.kit import OSLO, PARIS, START, Files, policy, region, write_zone
from tests.unit.sim.workflows import compare, run

T0 = START.timestamp()
COSTS = StepCosts(t_step=0.01, t_token=0.001, t_kv=1e-4, t_pair=1e-5, e_step=10.0, e_token=1.0, e_kv=0.1,
                  e_pair=0.01, idle_w=50.0, max_num_seqs=3, max_batched_tokens=8, kv_capacity_tokens=100)


def request(workflow_id: str | None, prompt: int = 500) -> Request:
    return Request(request_id="r", model="llama-3.1-8b", prompt_tokens=prompt, max_tokens=10, prefix_key="k",
                   workflow_id=workflow_id)


@pytest.mark.timeout(20)
def test_a_dispatch_shows_its_workflows_home_at_once_and_a_hit_from_the_next_publication() -> None:
    regions = (region("near", "CLEAN", PARIS), region("far", "DIRTY", OSLO))
    pol = policy()
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(pol))
    snap = builder.build(T0, {}, {})
    affinity = SimAffinity(pol)
    near = builder.candidates[0]
    affinity.record_dispatch(near, request("wf-1"), T0)
    affinity.record_dispatch(near, request(None), T0)  # no workflow id: nothing to remember
    seen = affinity.attach(snap, T0 + 0.001)
    assert set(seen.workflows) == {"wf-1"}
    home = seen.workflows["wf-1"]
    assert (home.place, home.cached_tokens, home.source) == ("near/h100", 500, "workflow")
    assert seen.prefix_warm == {}
    # A hit is recorded when its request finishes and shows once its region publishes.
    affinity.record_hit("near", "h100", "k", 480, T0 + 1.0)
    affinity.record_hit("far", "h100", "k", 300, T0 + 1.0)
    assert affinity.attach(snap, T0 + 1.5).prefix_warm == {}
    affinity.publish(T0 + 2.0, up=["near"])  # "far" is down: its hit waits
    warm = affinity.attach(snap, T0 + 2.0).prefix_warm["k"]
    assert [(w.place, w.cached_tokens, w.observed_at) for w in warm] == [("near/h100", 480, T0 + 1.0)]
    affinity.publish(T0 + 3.0, up=["near", "far"])
    assert {w.place for w in affinity.attach(snap, T0 + 3.0).prefix_warm["k"]} == {"near/h100", "far/h100"}
    # Both leave max_age.prefix_cache after they were seen, never used stale.
    max_age = pol.max_age.prefix_cache
    assert affinity.attach(snap, T0 + max_age).workflows["wf-1"] == home
    affinity.publish(T0 + 1.0 + max_age + 0.1, up=["near", "far"])
    later = affinity.attach(snap, T0 + 1.0 + max_age + 0.1)
    assert later.prefix_warm == {} and dict(later.workflows) == {}
    # What else the snapshot holds is the one it was given.
    assert later.perf is snap.perf and later.now == snap.now


@pytest.mark.timeout(20)
def test_a_pool_sends_a_warm_key_to_its_replica_while_that_one_has_room() -> None:
    candidate = SnapshotBuilder(compile_fleet((region("near", "CLEAN", PARIS, gpus=4),)), compile_policy(policy())).candidates[0]
    aware = PoolSim(candidate, COSTS, lambda seq: None, seed=1, prefix_aware=True)
    blind = PoolSim(candidate, COSTS, lambda seq: None, seed=1)

    def send(pool: PoolSim, key: str) -> int:
        seq = Seq(0.0, 10, 5, key, 8)
        replica = pool.choose(seq)
        replica.arrive(seq, 0.0)
        return pool.replicas.index(replica)

    # The first of a key goes where power-of-two choices sends it; the next two follow it
    # (the replica has room for 3 sequences) although it is then the busiest.
    first = send(aware, "k")
    assert send(blind, "k") == first  # the same random draws
    assert [send(aware, "k") for _ in range(2)] == [first, first]
    assert len(set(send(blind, "k") for _ in range(2)) | {first}) > 1
    # Full: the fourth goes by power-of-two choices, and the key follows it there.
    fourth = send(aware, "k")
    assert fourth != first
    assert send(aware, "k") == fourth


@pytest.mark.timeout(20)
def test_the_prefix_cache_serves_what_it_holds_and_keeps_the_most_left() -> None:
    cache = PrefixCache()
    assert cache.lookup("chain", 100, leaves=300) == 0  # a miss; the step leaves 300 warm
    assert cache.lookup("chain", 300, leaves=700) == 300  # the next step reuses all of it
    assert cache.lookup("chain", 900, leaves=200) == 700  # no more than the cache holds
    assert cache.lookup("chain", 700) == 700  # a shorter visit does not shrink it


@pytest.mark.timeout(20)
def test_affinity_lowers_the_joules_per_output_token_of_a_fanout(files: Files) -> None:
    # One region of 8 replicas: without affinity power-of-two choices spreads the siblings
    # and most rebuild the 4k prefix; with it the first sibling's replica serves them all.
    regions = (region("only", "CLEAN", OSLO, gpus=8),)
    result = compare(files, regions, policy(), "fanout:8:4096", hours=0.02, rate=0.2)
    f = result.workflow
    assert result.requests == result.ran == 8 * f["workflows"] > 0
    # All but the first sibling of each workflow hit.
    assert f["prefix_hit_share_affinity"] == pytest.approx(7 / 8)
    assert f["prefix_hit_share_no_affinity"] < 0.5
    assert f["j_per_output_token_affinity"] < f["j_per_output_token_no_affinity"]
    assert f["j_per_output_token_ratio"] == pytest.approx(
        f["j_per_output_token_no_affinity"] / f["j_per_output_token_affinity"])
    assert f["slo_attainment_affinity"] == f["slo_attainment_no_affinity"] == 1.0


@pytest.mark.timeout(20)
def test_siblings_stay_in_their_workflows_pool_with_affinity(files: Files) -> None:
    # Two equally clean regions near the client: without a workflow id the pending dispatches
    # of the first siblings make the other pool cheaper for the next ones; with it, leaving
    # the home costs the 4k tokens it holds warm.
    regions = (region("paris", "CLEAN", PARIS, gpus=8), region("oslo", "CLEAN", OSLO, gpus=8))
    result = compare(files, regions, load_fleet().policy("default"), "fanout:8:4096", hours=0.02, rate=0.2)
    f = result.workflow
    assert f["workflows_complete"] == f["workflows"] > 0
    assert f["workflows_in_one_pool_share_affinity"] == 1.0
    assert f["workflows_in_one_pool_share_no_affinity"] < 0.5
    assert f["j_per_output_token_affinity"] < f["j_per_output_token_no_affinity"]


@pytest.mark.timeout(20)
def test_a_sibling_the_home_cannot_serve_in_time_goes_elsewhere(files: Files) -> None:
    # The clean home has one replica; each sibling sent there adds its prefill to the home's
    # pending queue, so under a 500 ms + 50 ms/1k TTFT SLO the SLO filter rejects the home
    # after a few siblings and the rest run in the dirty region. With a 2 s SLO they all fit.
    regions = (region("clean", "CLEAN", OSLO, gpus=1), region("dirty", "DIRTY", PARIS, gpus=8))
    tight = run(files, regions, policy(ttft_ms=500.0, ttft_ms_per_1k=50.0), "fanout:8:4096", hours=0.02, rate=0.2)
    loose = run(files, regions, policy(), "fanout:8:4096", hours=0.02, rate=0.2)
    assert loose.region_share["clean"] == 1.0
    assert loose.workflow["workflows_in_one_pool_share"] == 1.0
    assert 0.0 < tight.region_share["clean"] < 1.0
    assert tight.workflow["workflows_in_one_pool_share"] == 0.0  # every workflow split
    assert tight.slo_attainment == 1.0  # the deadlines allowed only that
    assert tight.unschedulable == 0


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("shape", "held"), [("chain:3:512", False), ("dag:3:512", False), ("fanout:3:512", True)])
def test_a_chain_or_dag_step_is_never_held_by_the_deferral_queue(files: Files, shape: str, held: bool) -> None:
    # Dirty for three hours, then clean: a deferrable request that may wait waits for hour 3.
    write_zone(files.carbon_dir, "SWING", [400.0] * 3 + [50.0] * 3 + [400.0] * 42)
    regions = (region("only", "SWING", OSLO),)
    result = run(files, regions, policy(), shape, hours=0.02, rate=0.1, deferrable_share=1.0,
                 deferrable_deadline_s=6 * 3600.0, deferral=Deferral(forecast_error=0.0))
    d = result.deferral
    assert d["deferrable_requests"] == result.requests == result.ran > 0
    if held:
        assert d["deferred_held"] == d["deferrable_requests"] and d["deferred_not_holdable"] == 0
        assert d["deferred_wait_p50_s"] > 2 * 3600.0
    else:
        assert d["deferred_held"] == 0 and d["deferred_not_holdable"] == d["deferrable_requests"]
        assert d["deferred_wait_max_s"] == 0.0
        assert result.workflow["workflow_latency_p99_s"] < 60.0
