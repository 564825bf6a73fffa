"""What a pool's replica says about itself in every request's stream.

The replica (``RegionLLMServer``) yields its report as a stream's first item (before the
engine runs the request: it places the request on that replica) and as its last item (after
the engine's final chunk): ``{"x_replica": {...}}``, alone in its batch. The gateway takes
both out of the stream (``ReplicaReport.of_batch``); the client never sees them.

A report carries the replica's id, the node and GPUs it runs on (Ray's GPU ids of the
engine's workers: on a node whose GPUs Ray numbers as NVML does, NVML indices; empty where
the replica cannot tell, e.g. on CPU), and its engine's running sequences: ``running`` after
the engine's last step, and ``running_s``, their integral over the replica's clock
(``RunningIntegral``). The batch a request shared is then

    batch = (running_s(last) - running_s(first)) / (at(last) - at(first))

the sequences its replica ran, averaged over its lifetime there (waiting requests are not
running, and other replicas' sequences are not its batch): the step model's B
(``scheduler.energy.step``), at least 1 (the request itself ran).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

REPORT_KEY = "x_replica"


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    replica: str
    # The Ray node the replica's engine runs on ("" unknown) and its GPUs there.
    node: str
    gpus: tuple[int, ...]
    # Sequences the engine runs after its last step, and their integral (sequence-seconds).
    running: int
    running_s: float
    # The replica's monotonic clock (s): only differences between its own reports mean anything.
    at: float

    def as_item(self) -> dict[str, Any]:
        return {REPORT_KEY: {"replica": self.replica, "node": self.node, "gpus": list(self.gpus),
                             "running": self.running, "running_s": self.running_s, "at": self.at}}

    @classmethod
    def of_batch(cls, items: Sequence[Any]) -> ReplicaReport | None:
        """The report a stream batch is (one item, the report); None for any other batch."""
        if len(items) != 1 or not isinstance(items[0], dict) or REPORT_KEY not in items[0]:
            return None
        raw = items[0][REPORT_KEY]
        try:
            return cls(replica=str(raw["replica"]), node=str(raw["node"]),
                       gpus=tuple(int(g) for g in raw["gpus"]), running=int(raw["running"]),
                       running_s=float(raw["running_s"]), at=float(raw["at"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed replica report {raw!r}: {exc}") from None


def lifetime_batch(first: ReplicaReport, last: ReplicaReport) -> float:
    """The running sequences of the replica averaged between two of its reports (module doc);
    at least 1. Reports of the same instant: the running count then."""
    if last.at > first.at:
        return max(1.0, (last.running_s - first.running_s) / (last.at - first.at))
    return float(max(1, last.running))


@dataclass
class RunningIntegral:
    """An engine's running sequences over time: ``update`` after every engine step with the
    count the step leaves running (vLLM's scheduler stats, taken after finished requests
    leave), held until the next step; ``read`` gives the integral up to now. An idle engine
    takes no steps, and its last step left 0 running."""

    clock: Callable[[], float] = time.monotonic
    running: int = 0
    running_s: float = 0.0
    at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.at = self.clock()

    def update(self, running: int) -> None:
        now = self.clock()
        self.running_s += self.running * (now - self.at)
        self.at, self.running = now, running

    def read(self) -> tuple[float, float]:
        """(now, the integral up to now)."""
        now = self.clock()
        return now, self.running_s + self.running * (now - self.at)
