"""Per-model warmth (issue 31): each model of a pool has its own deployment, scaled on its own,
so the router judges a candidate warm or cold by its model's replicas, not the pool's. A pool
warm for llama-3.1-8b and at zero for llama-3.2-3b keeps taking 8b requests as a warm pool,
while a 3b request with an interactive TTFT budget avoids it."""

from __future__ import annotations

import pytest

from scheduler.state import codec
from scheduler.types import GeoPoint, ModelReplicas, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region

WARM_MODEL, COLD_MODEL = "llama-3.1-8b", "llama-3.2-3b"
MODELS = [{"name": WARM_MODEL, "max_context": 131072}, {"name": COLD_MODEL, "max_context": 131072}]
# Two pools of one region, same GPU and models: "a" is at zero for the second model, "b" warm for both.
FLEET = [region("r", pools=[pool("a", "H100-80GB", models=MODELS), pool("b", "H100-80GB", models=MODELS)])]


def req(model: str, **overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": "t", "model": model, "prompt_tokens": 500, "max_tokens": 100,
                                 "client_location": GeoPoint(40.0, -75.0)}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


def pool_state(cold_model_replicas: ModelReplicas) -> PoolLiveState:
    """Pool a as its gateway publishes it: one warm replica in all, of the first model."""
    return PoolLiveState(replicas=1 + cold_model_replicas.replicas,
                         starting_replicas=cold_model_replicas.starting_replicas,
                         models={WARM_MODEL: 131072, COLD_MODEL: 131072},
                         model_replicas={WARM_MODEL: ModelReplicas(1, 0), COLD_MODEL: cold_model_replicas})


def live(a: PoolLiveState) -> RegionLiveState:
    return RegionLiveState(region="r", healthy=True, observed_at=NOW, pools={"a": a, "b": PoolLiveState(replicas=2)})


def chosen_and_ranked(scheduler, make_snapshot, request: Request, a: PoolLiveState):  # type: ignore[no-untyped-def]
    # Pools a and b are alike (one region, one GPU, no load): only the warmth of the request's
    # model on pool a tells them apart.
    snapshot = make_snapshot(FLEET, live=[live(a)], carbon_signals=[carbon("Z-R", 300.0)])
    decision = scheduler.schedule(request, snapshot)
    return decision, {s.candidate.pool.name: s for s in decision.ranked}


@pytest.mark.timeout(60)
def test_a_model_at_zero_is_cold_on_a_pool_whose_other_model_is_warm(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    at_zero = pool_state(ModelReplicas(0, 0))
    # The warm model's request: pool a is warm for it, kept and charged no cold start.
    _, ranked = chosen_and_ranked(scheduler, make_snapshot, req(WARM_MODEL), at_zero)
    assert set(ranked) == {"a", "b"}
    assert dict(ranked["a"].quantities)["ttft-scorer"] == pytest.approx(dict(ranked["b"].quantities)["ttft-scorer"])
    snapshot = make_snapshot(FLEET, live=[live(at_zero)])
    warmth = {(c.pool.name, c.deployment.name): snapshot.perf[c.index].warmth for c in snapshot.candidates}
    assert warmth == {("a", WARM_MODEL): "warm", ("a", COLD_MODEL): "cold",
                      ("b", WARM_MODEL): "warm", ("b", COLD_MODEL): "warm"}
    # The model at zero, interactive (2 s TTFT budget, shorter than a cold start): pool a is
    # filtered out, its warm twin takes it.
    cold, ranked = chosen_and_ranked(scheduler, make_snapshot, req(COLD_MODEL), at_zero)
    assert set(ranked) == {"b"}
    assert cold.chosen is not None and cold.chosen.candidate.pool.name == "b"
    # Its replica starting: still no warm one, still avoided.
    _, ranked = chosen_and_ranked(scheduler, make_snapshot, req(COLD_MODEL), pool_state(ModelReplicas(0, 1)))
    assert set(ranked) == {"b"}
    # Once it has a warm replica of its own, pool a takes that model's requests again.
    _, ranked = chosen_and_ranked(scheduler, make_snapshot, req(COLD_MODEL), pool_state(ModelReplicas(1, 0)))
    assert set(ranked) == {"a", "b"}


@pytest.mark.timeout(60)
def test_without_per_model_counts_the_pools_counts_stand_for_every_model(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(FLEET, live=[live(PoolLiveState(replicas=1, starting_replicas=0))])
    assert {snapshot.perf[c.index].warmth for c in snapshot.candidates} == {"warm"}
    snapshot = make_snapshot(FLEET, live=[live(PoolLiveState(replicas=0, starting_replicas=0))])
    assert {snapshot.perf[c.index].warmth for c in snapshot.candidates if c.pool.name == "a"} == {"cold"}


@pytest.mark.timeout(30)
def test_per_model_counts_go_through_the_store_and_bad_ones_are_refused() -> None:
    state = live(pool_state(ModelReplicas(0, 1)))
    assert codec.decode_region_state(codec.encode_region_state(state)) == state
    raw = codec.encode_region_state(state).replace(b'"starting_replicas":1}', b'"starting_replicas":-1}')
    with pytest.raises(ValueError, match=r"pool 'a': model_replicas must map model names to"):
        codec.decode_region_state(raw)
