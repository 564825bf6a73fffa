"""A small in-process counter registry: the pollers count what they do and what fails, by
provider, zone and reason; whoever serves /metrics reads ``samples()`` (Prometheus text
exposition is one line per sample). ``signal_gauges`` says, from a router's snapshot, whether
each zone's carbon signal is usable now and, if not, why (``scheduler.signal_check``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.signal_check import signal_problem
from scheduler.types import FleetSnapshot

Labels = tuple[tuple[str, str], ...]

FAILURES = "carbon_provider_failures_total"
POLLS = "carbon_provider_polls_total"
WRITES = "carbon_signal_writes_total"
LOCK_CHANGES = "carbon_poller_lock_changes_total"
# Values fetched but not stored: signal_check found them unusable (labels part, reason).
REJECTED = "carbon_signal_rejected_total"
# A secondary part (forecast, index) left out of the polls after a 403 (label part).
PARTS_LEFT_OUT = "carbon_provider_parts_left_out_total"
# Router gauges per grid zone: 1 when the snapshot's signal may be used now, else 0 ...
SIGNAL_USABLE = "scheduler_carbon_signal_usable"
# ... and, when it may not, 1 with the reason: missing, invalid, future or stale.
SIGNAL_PROBLEM = "scheduler_carbon_signal_problem"


@dataclass
class Counters:
    _values: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = (name, tuple(sorted(labels.items())))
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, lab), v in self._values.items() if n == name and wanted <= set(lab))

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        return [(n, dict(lab), v) for (n, lab), v in sorted(self._values.items())]

    def exposition(self) -> str:
        """Prometheus text format."""
        lines = []
        for name, labels, value in self.samples():
            body = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{body}}} {value:g}")
        return "\n".join(lines) + ("\n" if lines else "")


def signal_gauges(snapshot: FleetSnapshot) -> list[tuple[str, Mapping[str, str], float]]:
    """Per grid zone of the snapshot's regions (and any other zone it has a signal for): is the
    signal usable at ``snapshot.now`` under the policy's ``max_age.carbon``, the same check the
    carbon scorer makes, and if not, why."""
    max_age_s = snapshot.policy.max_age.carbon
    zones = sorted({r.grid_zone for r in snapshot.regions} | set(snapshot.carbon))
    samples: list[tuple[str, Mapping[str, str], float]] = []
    for zone in zones:
        signal = snapshot.carbon.get(zone)
        problem = signal_problem(signal, snapshot.now, max_age_s) if signal is not None else None
        usable = signal is not None and problem is None
        samples.append((SIGNAL_USABLE, {"zone": zone}, float(usable)))
        if not usable:
            why = "missing" if problem is None else problem.kind
            samples.append((SIGNAL_PROBLEM, {"zone": zone, "problem": why}, 1.0))
    return samples
