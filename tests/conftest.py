"""Shared fixtures: the shipped configs, a scheduler, a snapshot factory."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import FleetConfig
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.types import FleetSnapshot, RegionLiveState, Signal
from tests.literals import NOW


@pytest.fixture(scope="session")
def shipped() -> FleetConfig:
    return load_checked_fleet()


@pytest.fixture(scope="session")
def default_policy(shipped: FleetConfig) -> PolicyConfig:
    return shipped.policy("default")


@pytest.fixture
def scheduler() -> Scheduler:
    return Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(7))


SnapshotFactory = Callable[..., FleetSnapshot]


@pytest.fixture
def make_snapshot(default_policy: PolicyConfig) -> SnapshotFactory:
    def make(
        regions: Sequence[RegionConfig],
        *,
        policy: PolicyConfig | None = None,
        carbon_signals: Sequence[Signal] = (),
        live: Sequence[RegionLiveState] = (),
        now: float = NOW,
        energy_routing_enabled: bool = True,
        carbon_bounds: Mapping[str, float] | None = None,
    ) -> FleetSnapshot:
        return SnapshotBuilder(compile_fleet(tuple(regions)), compile_policy(policy or default_policy)).build(
            now,
            carbon={s.key: s for s in carbon_signals},
            live={s.region: s for s in live},
            energy_routing_enabled=energy_routing_enabled,
            carbon_bounds=carbon_bounds,
        )

    return make


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault suite's table and figures (tests/faults), when any of its scenarios ran."""
    from tests.faults.load import FIGURES, HEADER, REPORT

    if REPORT:
        terminalreporter.write_sep("=", "fault suite")
        terminalreporter.write_line(HEADER)
        for row in REPORT:
            terminalreporter.write_line(row.line())
    for test, lines in FIGURES.items():
        terminalreporter.write_sep("=", test)
        for line in lines:
            terminalreporter.write_line(line)
