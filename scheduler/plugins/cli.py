"""``scheduler config validate`` and ``scheduler config schema``.

Here, beside the registry, because validating a policy means checking its plugins, their
parameters and its rates against the registered plugins."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scheduler.config.args import add_config_dirs, config_actions
from scheduler.config.loader import ConfigError, json_schemas
from scheduler.plugins import default_scheduler_registry, load_checked_fleet


def register(sub: Any) -> None:
    config_sub = config_actions(sub)
    validate = config_sub.add_parser("validate", help="exit 0 when every file is valid, else list each problem")
    add_config_dirs(validate)
    validate.set_defaults(handler=_validate)
    schema = config_sub.add_parser("schema", help="print the JSON Schema of region and policy files")
    schema.set_defaults(handler=_schema)


def _validate(args: argparse.Namespace) -> int:
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        print(f"{len(exc.issues)} problem(s) found", file=sys.stderr)
        return 1
    pools = sum(len(r.pools) for r in fleet.regions)
    gpus = sum(p.count for r in fleet.regions for p in r.pools)
    print(
        f"ok: {len(fleet.regions)} regions ({pools} pools, {gpus:,} GPUs) in {fleet.regions_dir}; "
        f"{len(fleet.policies)} policies ({', '.join(sorted(fleet.policies))}) in {fleet.policies_dir}"
    )
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps({**json_schemas(), "plugins": default_scheduler_registry().describe()}, indent=2))
    return 0
