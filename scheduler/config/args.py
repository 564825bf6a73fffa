"""Command-line arguments shared by the commands that read ``regions/`` and ``policies/``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS


def add_config_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regions", type=Path, default=EMBEDDED_REGIONS, help="folder of region YAML files")
    parser.add_argument("--policies", type=Path, default=EMBEDDED_POLICIES, help="folder of policy YAML files")


# The ``scheduler config ACTION`` subparsers, per top-level subparsers object: several parts of
# the package add actions to it (validate and schema beside the plugins, reload beside the router).
_CONFIG_ACTIONS: dict[int, Any] = {}


def config_actions(sub: Any) -> Any:
    """The subparsers of ``scheduler config`` (the command is made on the first call)."""
    actions = _CONFIG_ACTIONS.get(id(sub))
    if actions is None or "config" not in sub.choices:
        config = sub.add_parser("config", help="check, describe and reload the region and policy files")
        actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
        _CONFIG_ACTIONS[id(sub)] = actions
    return actions
