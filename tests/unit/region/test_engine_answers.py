"""Whether a pool is published is not how fast its engine answers a stats call: an engine slow
to answer (a loaded host) stays published on its last answer for the grace; one whose call
fails (the engine is dead, its replica died) is left out at once, until it answers again; one
silent past the grace, or that never answered, is not published."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError, RayTaskError
from ray.serve.exceptions import RequestCancelledError

from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.gateway import EngineAnswers, GatewaySettings, PoolEngine, RegionGateway
from scheduler.types import RegionLiveState
from tests.unit.region.fake_nvml import FakeNvml


def engine_dead() -> BaseException:
    """What awaiting a Serve handle raises when the replica's ``live_stats`` raised (its
    engine's health check failed)."""
    error: BaseException = RayTaskError(  # type: ignore[no-untyped-call]
        "live_stats", "Traceback ...", RuntimeError("engine dead")).as_instanceof_cause()
    return error


def test_a_slow_engine_keeps_its_last_answer_for_the_grace_only() -> None:
    answers = EngineAnswers(grace_s=30.0)
    first = {"running": 1.0}
    assert answers.standing("long", first, now=100.0) == first
    assert answers.standing("long", TimeoutError(), now=129.0) == first  # slow for 29 s: stands
    assert answers.standing("long", TimeoutError(), now=130.5) is None  # silent past the grace
    newer = {"running": 2.0}
    assert answers.standing("long", newer, now=131.0) == newer


def test_a_call_with_no_answer_in_time_is_a_slow_engine_however_it_ends() -> None:
    answers = EngineAnswers(grace_s=30.0)
    first = {"running": 1.0}
    answers.standing("long", first, now=100.0)
    # A timed-out call to a Serve replica can end cancelled rather than timed out (seen).
    for missed in (TimeoutError(), asyncio.CancelledError(), RequestCancelledError()):
        assert answers.standing("long", missed, now=110.0) == first


@pytest.mark.parametrize("failure", [engine_dead(), ActorDiedError()],
                         ids=["the engine's health check raised", "the replica died"])
def test_an_engine_whose_call_fails_is_left_out_until_it_answers_again(failure: BaseException) -> None:
    answers = EngineAnswers(grace_s=30.0)
    first = {"running": 1.0}
    assert answers.standing("long", first, now=100.0) == first
    assert answers.standing("long", failure, now=101.0) is None
    # Its replica restarting: calls wait for the new one, and no old answer stands meanwhile.
    assert answers.standing("long", TimeoutError(), now=102.0) is None
    assert answers.standing("long", first, now=103.0) == first


def test_a_pool_that_never_answered_is_not_published() -> None:
    answers = EngineAnswers(grace_s=30.0)
    assert answers.standing("chat", TimeoutError(), now=0.0) is None
    assert answers.standing("long", {"running": 0.0}, now=0.0) is not None
    assert answers.standing("chat", TimeoutError(), now=1.0) is None  # one pool's answer is not another's


class FakeEngine:
    """A pool deployment's handle as the gateway calls it (``live_stats.remote()``)."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.prompt_tokens_total = 0.0

    @property
    def live_stats(self) -> FakeEngine:
        return self

    async def remote(self) -> dict[str, float]:
        if self.mode == "slow":
            await asyncio.sleep(60.0)  # the gateway's timeout ends it
        if self.mode == "dead":
            raise engine_dead()
        return {"running": 0.0, "prompt_tokens_total": self.prompt_tokens_total, "max_model_len": 512.0}


def test_the_gateway_publishes_a_slow_pool_on_its_last_answer_and_leaves_a_failed_one_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU, whatever the machine: no power caps set, no energy meter.
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: FakeNvml(library_found=False))
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(library_found=False))
    region = next(r for r in load_checked_fleet().regions if r.name == "eu-north")
    engines = {"h200-long": FakeEngine(), "a100-batch": FakeEngine()}
    handles = {pool: {"tiny-llama": engine} for pool, engine in engines.items()}
    settings = GatewaySettings(region=region, pools={p: (PoolEngine("tiny-llama", 2048),) for p in engines},
                               tickets="disabled", engine_timeout_s=0.05)
    cls = RegionGateway.func_or_class  # type: ignore[attr-defined]

    async def publications() -> tuple[list[RegionLiveState], RegionLiveState]:
        gateway = cls.__new__(cls)
        await gateway.__init__(handles, settings)
        states = [await gateway.live_state()]
        await asyncio.sleep(0.05)
        engines["h200-long"].prompt_tokens_total = 900.0
        states.append(await gateway.live_state())  # both answer: the prompt rate is measured
        engines["h200-long"].mode = "slow"
        states.append(await gateway.live_state())
        engines["a100-batch"].mode = "dead"
        states.append(await gateway.live_state())
        # A gateway started while an engine is still slow to come up has no answer of it to stand.
        newcomer = cls.__new__(cls)
        await newcomer.__init__(handles, settings)
        first = await newcomer.live_state()
        for started in (gateway, newcomer):
            await started.__del__()

        class Stopped(cls):  # type: ignore[misc, valid-type]
            def __del__(self) -> None:  # torn down above: nothing for the garbage collector to await
                pass

        gateway.__class__ = newcomer.__class__ = Stopped
        return states, first

    (_, measured, slow, dead), newcomer = asyncio.run(publications())
    assert set(measured.pools) == {"h200-long", "a100-batch"}
    assert measured.pools["h200-long"].prompt_tokens_rate > 0
    # A slow engine still serves: published, its models and rates those of its last answer
    # (not a prompt rate falling as if no prompt tokens arrived).
    assert set(slow.pools) == {"h200-long", "a100-batch"}
    assert slow.pools["h200-long"] == measured.pools["h200-long"]
    # An engine whose call failed is left out at once; the slow one stays.
    assert set(dead.pools) == {"h200-long"} and dead.healthy
    assert set(newcomer.pools) == set() and not newcomer.healthy
