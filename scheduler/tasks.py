"""Background tasks that start, run and stop as they should on Python 3.11.

Python 3.11's timeouts (``asyncio.timeout``, ``asyncio.wait_for`` and the ones redis-py and
httpx put around every socket read) cancel the waiting task when they expire. When the read
completes in the same turn of the event loop as the expiry, the timeout exits normally but
the cancel it requested stays pending (``Task.uncancel`` does not clear it before 3.13): the
task's *next* await raises a stray ``CancelledError``. On a loaded host that happened in our
own tests, once killing a test's task and once turning a router's stop into an endless loop.
So:

- ``isolated(make)``: runs one store call in a child task, so a stray cancel from the call's
  own timeout lands in the child (and surfaces as the call failing), never in the caller;
- ``start_loop(run, name)``: a long-lived loop that a stray cancel restarts instead of ending;
- ``run_every(interval_s, step, what)``: the loop of a periodic task (run under ``start_loop``),
  which a failing step never ends;
- ``stop_task(task)``: cancels until the task has really ended (a cancel that lands as an inner
  timeout fires is turned into that ``TimeoutError`` and a loop would go round again).

A real cancel is told from a stray one by ``Task.cancelling()``: a cancel somebody asked for is
still counted; a stray one was already uncounted by the timeout that caused it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

RECANCEL_EVERY_S = 0.5
# A writer woken by new work waits this long before its pass, so the work that arrives together
# (the ledger's and the audit's receipts, one per stream: hundreds a second on a busy router)
# is written in one pass, not one each: a group commit.
WRITE_LINGER_S = 0.02


class Interrupted(Exception):
    """The call's task ended cancelled although nobody cancelled the caller: treat it as a
    failed call (whether it took effect is unknown, as for a timeout)."""


def cancel_was_asked() -> bool:
    """In an ``except CancelledError``: True when this task was really asked to stop."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def isolated(make: Callable[[], Awaitable[T]]) -> T:
    """``await make()`` in a child task. The caller's own cancel is passed on to the child; a
    stray cancel inside the child raises ``Interrupted`` here instead of cancelling the caller."""
    child: asyncio.Future[T] = asyncio.ensure_future(make())
    try:
        await asyncio.wait({child})
    except asyncio.CancelledError:
        child.cancel()
        raise
    if child.cancelled():
        raise Interrupted("the call was cancelled inside (a timeout's stray cancel)")
    return child.result()


def start_loop(run: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
    """A task running ``run()`` (a loop meant to last until stopped) that a stray cancel
    restarts; ``stop_task`` ends it."""

    async def supervised() -> None:
        while True:
            try:
                await run()
                return
            except asyncio.CancelledError:
                if cancel_was_asked():
                    raise
                log.warning("%s: a stray cancellation (a timeout's, Python 3.11) ended a pass; going on", name)

    return asyncio.create_task(supervised(), name=name)


async def run_every(interval_s: float, step: Callable[[], Awaitable[object]], what: str, *,
                    first_after_s: float = 0.0) -> None:
    """``await step()`` every ``interval_s`` until cancelled, the first after ``first_after_s``
    (``interval_s`` where the caller ran one itself as it started); a step that fails is logged
    (as ``what`` failing) and the next one runs on time: a failing source or store never ends it."""
    if first_after_s > 0:
        await asyncio.sleep(first_after_s)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed", what)
        await asyncio.sleep(interval_s)


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again every 0.5 s while it runs.
    An exception it ended with is logged, not raised: stopping goes on with the next part."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_EVERY_S)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s ended with an error", task.get_name(), exc_info=task.exception())
