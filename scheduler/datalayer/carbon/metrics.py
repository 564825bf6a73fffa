"""A small in-process counter registry: the pollers count what they do and what fails, by
provider, zone and reason; whoever serves /metrics reads ``samples()`` (Prometheus text
exposition is one line per sample)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

FAILURES = "carbon_provider_failures_total"
POLLS = "carbon_provider_polls_total"
WRITES = "carbon_signal_writes_total"
LOCK_CHANGES = "carbon_poller_lock_changes_total"


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
