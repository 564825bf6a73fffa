"""scheduler.tasks: stray cancels (Python 3.11 timeouts) fail a call or restart a loop, never
end a caller; stop_task ends even a loop that swallows a cancel; run_every goes on past a
failing step.

A stray cancel is made here as a timeout makes it: ``cancel()`` then ``uncancel()`` on a task
that waits, so it wakes with ``CancelledError`` while nobody counts a cancel request."""

from __future__ import annotations

import asyncio
import logging

import pytest

from scheduler.tasks import Interrupted, isolated, run_every, start_loop, stop_task

pytestmark = pytest.mark.timeout(10)


def stray_cancel(task: asyncio.Task[object]) -> None:
    task.cancel()
    task.uncancel()


async def test_a_stray_cancel_inside_an_isolated_call_fails_the_call_not_the_caller() -> None:
    inner: list[asyncio.Task[object]] = []

    async def call() -> str:
        task = asyncio.current_task()
        assert task is not None
        inner.append(task)
        await asyncio.sleep(5)
        return "never"

    async def caller() -> str:
        try:
            await isolated(call)
        except Interrupted:
            await asyncio.sleep(0.01)  # the caller's next await is not cancelled
            return "failed call, caller alive"
        return "unexpected"

    outer = asyncio.create_task(caller())
    while not inner:
        await asyncio.sleep(0)
    stray_cancel(inner[0])
    assert await outer == "failed call, caller alive"


async def test_an_isolated_call_returns_its_result_and_raises_its_error() -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    async def broken() -> int:
        raise ValueError("no")

    assert await isolated(ok) == 7
    with pytest.raises(ValueError, match="no"):
        await isolated(broken)


async def test_the_callers_cancel_reaches_the_isolated_call() -> None:
    inner: list[asyncio.Task[object]] = []

    async def call() -> None:
        task = asyncio.current_task()
        assert task is not None
        inner.append(task)
        await asyncio.sleep(5)

    outer = asyncio.create_task(isolated(call))
    while not inner:
        await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.sleep(0)
    assert inner[0].cancelled()


async def test_a_loop_goes_on_after_a_stray_cancel_and_ends_on_stop() -> None:
    passes = 0

    async def run() -> None:
        nonlocal passes
        while True:
            passes += 1
            await asyncio.sleep(0.01)

    task = start_loop(run, "test-loop")
    await asyncio.sleep(0.05)
    stray_cancel(task)
    before = passes
    await asyncio.sleep(0.1)
    assert not task.done() and passes > before
    await stop_task(task)
    assert task.cancelled()


async def test_stop_ends_a_loop_that_turns_one_cancel_into_a_timeout() -> None:
    """As a loop does whose store read timed out in the same turn as the cancel arrived."""
    swallowed = 0

    async def run() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # the cancel became an "outage": the loop goes round again

    task = asyncio.create_task(run())
    await asyncio.sleep(0.02)
    await stop_task(task)
    assert task.done() and swallowed == 1


async def test_run_every_logs_a_failing_step_and_runs_the_next(caplog: pytest.LogCaptureFixture) -> None:
    steps: list[int] = []

    async def step() -> None:
        steps.append(len(steps))
        if len(steps) == 1:
            raise RuntimeError("the store is down")

    loop = start_loop(lambda: run_every(0.01, step, "publishing"), "every")
    with caplog.at_level(logging.ERROR, logger="scheduler.tasks"):
        while len(steps) < 3:
            await asyncio.sleep(0.01)
    await stop_task(loop)
    assert loop.cancelled()
    assert [r.getMessage() for r in caplog.records] == ["publishing failed"]
    assert caplog.records[0].exc_info is not None and "the store is down" in str(caplog.records[0].exc_info[1])


async def test_run_every_waits_first_after_s_before_its_first_step() -> None:
    late: list[None] = []
    at_once: list[None] = []

    async def step_late() -> None:
        late.append(None)

    async def step_at_once() -> None:
        at_once.append(None)

    waiting = start_loop(lambda: run_every(0.01, step_late, "late", first_after_s=60.0), "late")
    stepping = start_loop(lambda: run_every(0.01, step_at_once, "at once"), "at-once")
    while len(at_once) < 3:
        await asyncio.sleep(0.01)
    await stop_task(waiting)
    await stop_task(stepping)
    assert late == []
