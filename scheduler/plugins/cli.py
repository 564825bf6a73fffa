"""``scheduler config validate`` and ``scheduler config schema``.

Here, beside the registry, because validating a policy means checking its plugins, their
parameters and its rates against the registered plugins."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs, config_actions
from scheduler.config.loader import ConfigError, ConfigIssue, FleetConfig, json_schemas
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet


def register(sub: Any) -> None:
    config_sub = config_actions(sub)
    validate = config_sub.add_parser("validate", help="exit 0 when every file is valid, else list each problem (exit 4)")
    add_config_dirs(validate)
    validate.add_argument("--json", action="store_true",
                          help="print the result as one JSON object (ok, folders, regions, policies, issues, warnings)")
    validate.set_defaults(handler=_validate)
    schema = config_sub.add_parser("schema", help="print the JSON Schema of region and policy files")
    schema.set_defaults(handler=_schema)


def _validate(args: argparse.Namespace) -> int:
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
    except ConfigError as exc:
        if args.json:
            print(json.dumps(_validation(args.regions, args.policies, issues=exc.issues), indent=2))
        else:
            for issue in exc.issues:
                print(issue, file=sys.stderr)
            print(f"{len(exc.issues)} problem(s) found", file=sys.stderr)
        return exit_codes.CONFIG
    pools = sum(len(r.pools) for r in fleet.regions)
    gpus = sum(p.count for r in fleet.regions for p in r.pools)
    if not args.json:
        for warning in fleet.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(_validation(fleet.regions_dir, fleet.policies_dir, fleet=fleet, pools=pools, gpus=gpus),
                         indent=2))
        return exit_codes.OK
    print(
        f"ok: {len(fleet.regions)} regions ({pools} pools, {gpus:,} GPUs) in {fleet.regions_dir}; "
        f"{len(fleet.policies)} policies ({', '.join(sorted(fleet.policies))}) in {fleet.policies_dir}"
    )
    return exit_codes.OK


def _validation(regions_dir: Path, policies_dir: Path, *, fleet: FleetConfig | None = None, pools: int = 0, gpus: int = 0,
                issues: tuple[ConfigIssue, ...] = ()) -> dict[str, Any]:
    """``config validate --json``: the same facts as the text, as one object."""
    return {
        "ok": fleet is not None,
        "regions_dir": str(regions_dir),
        "policies_dir": str(policies_dir),
        "regions": sorted(r.name for r in fleet.regions) if fleet else [],
        "policies": sorted(fleet.policies) if fleet else [],
        "pools": pools,
        "gpus": gpus,
        "issues": [{"file": i.file, "field": i.field, "message": i.message} for i in issues],
        "warnings": list(fleet.warnings) if fleet else [],
    }


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps({**json_schemas(), "plugins": default_scheduler_registry().describe()}, indent=2))
    return exit_codes.OK
