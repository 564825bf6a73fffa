"""Ends gRPC streams whose client stopped reading.

grpc.aio's ``context.write`` waits while HTTP/2 flow control holds a message back: a client that
stops reading (its stream window full) would hold the call, its tenant's stream slot and its
region stream for as long as it likes, past ``--max-stream-s`` (the dispatcher's deadline is
checked as text arrives, and nothing arrives while the writer waits). So each streaming call is
watched while it writes: ``Watched.since`` is set before a write and cleared after it, and a
sweep once a second (scheduled only while calls are watched) cancels a call whose write has
waited ``write_timeout_s``, or that is still waiting past its ``max_stream_s``. The call's task
gets ``CancelledError`` inside the write and its handler unwinds as when the client cancels:
the slot is given back and what was sent is billed with end_reason ``cancelled``.

What grpcio cannot do: reset the HTTP/2 stream from the server (``context.abort`` queues the
status behind the message flow control holds, and the aio server has no cancel). After the
cancellation the stream stays in gRPC core, with the one message it was writing, until the
client resets it, its deadline passes or the connection closes; ``grpc.max_concurrent_streams``
bounds how many one connection holds.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field

SWEEP_S = 1.0


class Watched:
    """One streaming call: its task, since when its current write waits (loop time, at the
    sweep's resolution; None: not writing), its deadline, and what ended it (None: nothing)."""

    __slots__ = ("deadline", "ended", "since", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.since: float | None = None
        self.ended: str | None = None


@dataclass
class StalledWrites:
    # How long one write may wait on the client.
    write_timeout_s: float = 30.0
    # The longest a stream may last (None: no limit): a writer still waiting past it is ended.
    max_stream_s: float | None = None
    # The loop's clock at the last sweep (or when the first call was watched).
    now: float = 0.0
    # Calls ended, by what ended them: write-timeout, max-stream.
    ended: Counter[str] = field(default_factory=Counter)
    _watched: set[Watched] = field(default_factory=set, init=False, repr=False)
    _sweeper: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.write_timeout_s < math.inf:
            raise ValueError(f"write_timeout_s: expected seconds > 0, got {self.write_timeout_s!r}")

    def watch(self) -> Watched:
        """Watch the current task's call until ``forget``."""
        task = asyncio.current_task()
        assert task is not None, "watch() runs in the call's task"
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self.now = loop.time()
            self._sweeper = loop.call_later(SWEEP_S, self._sweep)
        limit = self.max_stream_s
        watched = Watched(task, math.inf if limit is None else self.now + limit)
        self._watched.add(watched)
        return watched

    def forget(self, watched: Watched) -> None:
        self._watched.discard(watched)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = self.now = loop.time()
        for watched in self._watched:
            since = watched.since
            if since is None or watched.ended is not None:
                continue
            if now - since >= self.write_timeout_s:
                watched.ended = "write-timeout"
            elif now >= watched.deadline:
                watched.ended = "max-stream"
            else:
                continue
            self.ended[watched.ended] += 1
            watched.task.cancel()
        self._sweeper = loop.call_later(SWEEP_S, self._sweep) if self._watched else None
