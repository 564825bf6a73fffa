"""What the decision's fast path must keep: objects built without their generated
constructors are the same objects, frames updated in place of a rebuild equal a rebuild, and
plugin timings are sampled as documented."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.columns import frame
from scheduler.framework.plugin import RequestView
from scheduler.framework.predict import request_view
from scheduler.framework.scheduler import Scheduler
from scheduler.framework.state import selected
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.types import Decision, GeoPoint, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region


def req(i: int = 0, **overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": f"r{i}", "model": "llama-3.1-8b", "prompt_tokens": 700,
                                 "max_tokens": 300, "client_location": GeoPoint(48.0, 11.0)}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


def fields_of(instance: object) -> dict[str, object]:
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}  # type: ignore[arg-type]


def test_a_decision_has_every_field_the_constructor_sets(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a", zone="A"), region("b", zone="B")],
                             carbon_signals=[carbon("A", 100), carbon("B", 300)])
    for request in (req(), req(1, model="no-such-model")):
        decision = scheduler.schedule(request, snapshot)
        assert set(vars(decision)) >= {f.name for f in dataclasses.fields(Decision)}
        rebuilt = Decision(**fields_of(decision))  # type: ignore[arg-type]
        assert all(getattr(rebuilt, name) is value for name, value in fields_of(decision).items())
        with pytest.raises(dataclasses.FrozenInstanceError):
            decision.policy = "other"  # type: ignore[misc]


def test_a_request_view_is_what_its_constructor_makes(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a"), region("b", lat=10.0)])
    base, _ = selected(ModelIndex(), req(), snapshot)
    view = request_view(req(), snapshot, base)
    assert {f.name for f in dataclasses.fields(RequestView)} == set(vars(view))
    rebuilt = RequestView(**fields_of(view))  # type: ignore[arg-type]
    assert all(getattr(rebuilt, name) is value for name, value in fields_of(view).items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.base = base  # type: ignore[misc]


def test_a_frame_updated_from_the_last_perf_tuple_equals_a_rebuilt_one(default_policy) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    regions = [region(f"r{i}", pools=[pool("h100", "H100-80GB"), pool("a100", "A100-80GB", count=16)])
               for i in range(12)]
    builder = SnapshotBuilder(compile_fleet(tuple(regions)), compile_policy(default_policy))

    def live() -> dict[str, RegionLiveState]:
        return {r.name: RegionLiveState(r.name, True, NOW, {p.name: PoolLiveState(
            running=rng.choice((0, 5, 40)), queue_depth=rng.choice((0, 3))) for p in r.pools}) for r in regions}

    states = live()
    for step in range(30):
        if step % 7 == 0:
            states = live()  # most candidates change: rebuilt
        else:
            changed = regions[rng.randrange(len(regions))].name
            states = {**states, changed: live()[changed]}  # a few change: updated in place
        snapshot = builder.build(NOW, live=states)
        base, _ = selected(ModelIndex(), req(), snapshot)
        cols = frame(snapshot, "llama-3.1-8b", base)
        fresh = SnapshotBuilder(compile_fleet(tuple(regions)), compile_policy(default_policy)).build(NOW, live=states)
        expected = frame(fresh, "llama-3.1-8b", base)
        assert np.array_equal(cols.prediction, expected.prediction)
        assert np.array_equal(cols.queue_wait_s, expected.queue_wait_s)
        assert np.array_equal(cols.live, expected.live)


def test_plugins_are_timed_on_the_first_decision_then_one_in_timing_every(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a", zone="A")], carbon_signals=[carbon("A", 100)])
    scheduler = Scheduler.from_registry(default_scheduler_registry())
    timed = [bool(scheduler.schedule(req(i), snapshot).plugin_timings_ns) for i in range(3 * scheduler.timing_every)]
    assert timed == [i % scheduler.timing_every == 0 for i in range(len(timed))]
    every = dataclasses.replace(scheduler, timing_every=1)
    assert all(every.schedule(req(i), snapshot).plugin_timings_ns for i in range(5))
    with pytest.raises(ValueError, match="timing_every"):
        dataclasses.replace(scheduler, timing_every=0)
