"""scheduler.http.server.eager_task: a handler that needs no I/O runs to its end at once; one
that waits continues in a Task that behaves as if it had been one from the start (its result,
its exceptions, its cancellation, its context)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from scheduler.http.server import eager_task

pytestmark = pytest.mark.timeout(10)

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def test_a_coroutine_that_never_waits_runs_now_without_a_task() -> None:
    ran: list[str] = []

    async def answer() -> None:
        ran.append("done")

    assert eager_task(answer()) is None
    assert ran == ["done"]


async def test_a_coroutine_that_waits_runs_up_to_its_wait_now_and_the_rest_in_a_task() -> None:
    steps: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def answer() -> None:
        steps.append("before")
        value = await gate
        await asyncio.sleep(0)  # a bare yield to the loop, then more work
        steps.append(f"after {value}")

    task = eager_task(answer())
    assert task is not None and steps == ["before"]
    gate.set_result(7)
    await task
    assert steps == ["before", "after 7"]


async def test_cancelling_the_task_cancels_the_wait_inside_the_coroutine() -> None:
    events: list[str] = []

    async def answer() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        finally:
            events.append("finally")

    task = eager_task(answer())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["cancelled", "finally"]


async def test_an_exception_after_the_wait_is_the_tasks() -> None:
    async def answer() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    task = eager_task(answer())
    assert task is not None
    with pytest.raises(RuntimeError, match="boom"):
        await task


async def test_both_halves_run_in_one_context_of_their_own() -> None:
    values: list[str] = []

    async def answer() -> None:
        seen.set("handler")
        await asyncio.sleep(0)
        values.append(seen.get())

    task = eager_task(answer())
    assert task is not None
    await task
    # The handler's variable reached its second half and did not leak into the caller's context.
    assert values == ["handler"] and seen.get() == "unset"
