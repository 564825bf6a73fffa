"""Command-line arguments shared by the commands that read ``regions/`` and ``policies/``."""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS


def add_config_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regions", type=Path, default=EMBEDDED_REGIONS, help="folder of region YAML files")
    parser.add_argument("--policies", type=Path, default=EMBEDDED_POLICIES, help="folder of policy YAML files")
