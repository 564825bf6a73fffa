"""Command-line arguments shared by the commands that read ``regions/`` and ``policies/``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from scheduler.config.loader import EXAMPLES_DIR, SHIPPED_CONFIG, config_dir

DIRS_HELP = "(default: ./{kind} if it exists, else the examples shipped with the package)"


def add_config_dirs(parser: argparse.ArgumentParser) -> None:
    """--regions and --policies; ``resolve_config_dirs`` fills in the ones not given."""
    parser.add_argument("--regions", type=Path, default=None,
                        help=f"folder of region YAML files {DIRS_HELP.format(kind='regions')}")
    parser.add_argument("--policies", type=Path, default=None,
                        help=f"folder of policy YAML files {DIRS_HELP.format(kind='policies')}")


def resolve_config_dirs(args: argparse.Namespace, cwd: Path, err: TextIO) -> None:
    """Set the --regions and --policies a command has but was not given (``loader.config_dir``),
    and say on ``err`` when they are the shipped examples: the fleet routed is then not the
    operator's own, and they should know."""
    shipped = []
    for kind in SHIPPED_CONFIG:
        if not hasattr(args, kind):
            continue
        given = getattr(args, kind)
        folder = config_dir(kind, given, cwd)
        setattr(args, kind, folder)
        if given is None and folder == SHIPPED_CONFIG[kind]:
            shipped.append(kind)
    if shipped:
        kinds = " and ".join(shipped)
        print(f"scheduler: using the example {kinds} shipped with the package ({EXAMPLES_DIR}): no "
              f"{' or '.join(f'--{k}' for k in shipped)} given and no {' or '.join(f'./{k}' for k in shipped)} here; "
              "`scheduler init DIR` writes a copy to edit", file=err)


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
