"""The config as every command and server loads it: ``regions/`` and ``policies/`` read by the
loader (scheduler.config.loader), each policy's plugins checked against the registry
(``register_all``). Apart from the registration list so that registering plugins needs no loader."""

from __future__ import annotations

from pathlib import Path

from scheduler.config.loader import FleetConfig, PolicyChecker, load_fleet
from scheduler.plugins import default_scheduler_registry


def load_checked_fleet(regions_dir: Path | None = None, policies_dir: Path | None = None) -> FleetConfig:
    """``regions/`` and ``policies/`` loaded and every policy's plugins checked against the
    registry (the loader every command and server uses)."""
    checker: PolicyChecker = default_scheduler_registry()
    return load_fleet(regions_dir, policies_dir, checker)
