"""``scheduler config reload --router ADDR``: have a running router reload its config files.

The router re-reads regions/, policies/, its keys and budgets files, validates them and, when
they are valid and new, applies them and publishes them as the fleet's version (every router
on the same store follows within seconds; docs/hot-reload.md). Exit 0 when the files are valid
(applied, or already in use), 4 when they are not (each problem printed as file: field:
message; the router keeps its version), 1 when the router cannot be asked (docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import config_actions

API_KEY_ENV = "SCHEDULER_API_KEY"


def register(sub: Any) -> None:
    reload = config_actions(sub).add_parser(
        "reload", help="have a running router reload its config files (and publish them to every router)")
    reload.add_argument("--router", default="127.0.0.1:50051", help="the router's gRPC address (default %(default)s)")
    reload.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"an admin key (default ${API_KEY_ENV}; none for a router run with --insecure)")
    reload.add_argument("--tls", action="store_true", help="TLS to the router, verified with the system roots")
    reload.add_argument("--tls-ca", type=Path, help="TLS to the router, verified with this CA (PEM)")
    reload.add_argument("--dry-run", action="store_true",
                        help="only validate the router's files and say what a reload would do")
    reload.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)")
    reload.add_argument("--json", action="store_true", help="print the answer as JSON")
    reload.set_defaults(handler=_reload)


def _reload(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from scheduler.client import SchedulerClient
    from scheduler.client.common import TlsConfig
    from scheduler.client.errors import SchedulerRpcError

    tls: TlsConfig | bool = TlsConfig(ca_cert=args.tls_ca) if args.tls_ca else bool(args.tls)
    try:
        with SchedulerClient(args.router, api_key=args.api_key, tls=tls, timeout_s=args.timeout) as client:
            answer = client.reload_config(dry_run=args.dry_run)
    except SchedulerRpcError as exc:
        print(f"config reload: router at {args.router}: {exc}", file=sys.stderr)
        return exit_codes.FAILURE
    if args.json:
        print(json.dumps(json_format.MessageToDict(answer, preserving_proto_field_name=True,
                                                   always_print_fields_with_no_presence=True), indent=2))
        return exit_codes.OK if answer.ok else exit_codes.CONFIG
    for problem in answer.problems:
        where = ": ".join(part for part in (problem.file, problem.field) if part)
        print(f"{where}: {problem.message}" if where else problem.message, file=sys.stderr)
    if not answer.ok:
        print(f"config not reloaded: {len(answer.problems)} problem(s); the router keeps version {answer.version}",
              file=sys.stderr)
        return exit_codes.CONFIG
    if args.dry_run:
        print(f"ok: the files are valid (sha256 {answer.files_digest[:12]}); version in use {answer.version}")
    elif answer.changed:
        published = "published to every router" if answer.published else f"not published yet: {answer.publish_error}"
        print(f"config version {answer.version} in use (was {answer.previous_version}); {published}")
    else:
        print(f"unchanged: the files are version {answer.version} ({answer.source})")
    return 0
