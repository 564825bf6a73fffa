"""``scheduler admin``: a running router's operator API (``RouterAdmin`` and ``ListRegions``).

    scheduler admin status --router router:50051           # the router's view: regions, carbon, store
    scheduler admin regions                                 # each region: health, state age, carbon
    scheduler admin kill-switch on --reason "feed wrong"    # energy/carbon ranking off, every router
    scheduler admin kill-switch off                         # and back on

The key comes from ``--api-key`` or ``$SCHEDULER_API_KEY`` (an admin key: ``status`` and
``kill-switch`` need the admin role, ``regions`` any tenant's key); a router run with
``--insecure`` needs none. A router on TLS takes ``--tls`` (the system roots) or ``--tls-ca``,
and ``--tls-cert``/``--tls-key`` for mutual TLS. ``--json`` prints the answer as one JSON
object. Exit 0 when the router answered, 1 when it did not or refused the call (docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler import exit_codes

if TYPE_CHECKING:
    from scheduler.client import SchedulerClient

API_KEY_ENV = "SCHEDULER_API_KEY"
DEFAULT_ROUTER = "127.0.0.1:50051"


def register(sub: Any) -> None:
    admin = sub.add_parser("admin", help="a running router's admin API: status, regions, the kill switch")
    actions = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")

    status = actions.add_parser("status", help="the router's status: policy, store, regions, carbon zones, streams")
    _connection(status)
    status.add_argument("--json", action="store_true", help="print the answer as JSON")
    status.set_defaults(handler=_run, action=_status)

    regions = actions.add_parser("regions", help="every region as the router sees it: health, state age, carbon")
    _connection(regions)
    regions.add_argument("--json", action="store_true", help="print the answer as JSON")
    regions.set_defaults(handler=_run, action=_regions)

    kill = actions.add_parser(
        "kill-switch", help="turn energy and carbon ranking off (on) or back on (off) for every router sharing "
                            "the store, within about a second; routing goes on in the performance order")
    states = kill.add_subparsers(dest="kill_switch", required=True, metavar="STATE")
    engage = states.add_parser("on", help="energy and carbon ranking OFF on every router")
    engage.add_argument("--reason", required=True, help="why (logged by the router and kept with the flag)")
    release = states.add_parser("off", help="energy and carbon ranking back ON on every router")
    release.add_argument("--reason", default="", help="why (logged by the router and kept with the flag)")
    for action, energy_routing in ((engage, False), (release, True)):
        _connection(action)
        action.set_defaults(handler=_run, action=_kill_switch, energy_routing=energy_routing)


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router", default=DEFAULT_ROUTER, help="the router's gRPC address (default %(default)s)")
    parser.add_argument("--api-key", default=None,
                        help=f"the key (default ${API_KEY_ENV}; none for a router run with --insecure)")
    parser.add_argument("--tls", action="store_true", help="TLS to the router, verified with the system roots")
    parser.add_argument("--tls-ca", type=Path, help="TLS to the router, verified with this CA (PEM)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS; with --tls-key)")
    parser.add_argument("--tls-key", type=Path, help="client key (mutual TLS)")
    parser.add_argument("--server-name", help="verify the router's certificate as this name (TLS)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)")


def _client(args: argparse.Namespace) -> SchedulerClient:
    from scheduler.client import SchedulerClient
    from scheduler.client.common import TlsConfig

    tls: TlsConfig | bool = bool(args.tls)
    if args.tls_ca or args.tls_cert or args.server_name:
        tls = TlsConfig(ca_cert=args.tls_ca, client_cert=args.tls_cert, client_key=args.tls_key,
                        server_name=args.server_name)
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    return SchedulerClient(args.router, api_key=key or None, tls=tls, timeout_s=args.timeout)


def _run(args: argparse.Namespace) -> int:
    from scheduler.client.errors import SchedulerRpcError

    if bool(args.tls_cert) != bool(args.tls_key):
        print("admin: --tls-cert and --tls-key go together", file=sys.stderr)
        return exit_codes.USAGE
    try:
        with _client(args) as client:
            code: int = args.action(args, client)
            return code
    except SchedulerRpcError as exc:
        print(f"admin {args.admin_command}: router at {args.router}: {exc}", file=sys.stderr)
        return exit_codes.FAILURE


def _as_dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    answer: dict[str, Any] = MessageToDict(message, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
    return answer


def _when(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if unix_s else "-"


def _status(args: argparse.Namespace, client: SchedulerClient) -> int:
    answer = client.status()
    if args.json:
        print(json.dumps(_as_dict(answer), indent=2))
        return exit_codes.OK
    store = "reachable" if answer.state_reachable else f"UNREACHABLE ({answer.last_state_error or 'no read yet'})"
    last_read = _when(answer.last_state_read_unix_s) if answer.HasField("last_state_read_unix_s") else "never"
    lines = [
        f"router          {args.router} (scheduler {answer.version})",
        f"energy routing  {'on' if answer.energy_routing else 'OFF (kill switch on: performance order)'}",
        f"policy          {answer.policy} (config {answer.config_version})",
        f"store           {answer.state_backend}, namespace {answer.namespace}: {store}; last read {last_read}",
        f"regions         {answer.healthy_regions} of {answer.regions} healthy, {answer.candidates} candidates",
        f"carbon          {answer.fresh_carbon_zones} fresh zone(s)",
        f"streams         {answer.active_streams} active",
    ]
    if answer.config_rejected:
        lines.append(f"config          {answer.config_rejected} record(s) refused; last: {answer.config_last_rejection}")
    print("\n".join(lines))
    return exit_codes.OK


def _regions(args: argparse.Namespace, client: SchedulerClient) -> int:
    answer = client.list_regions()
    if args.json:
        print(json.dumps({"regions": [_as_dict(region) for region in answer]}, indent=2))
        return exit_codes.OK
    rows = [("region", "health", "state age", "zone", "carbon", "pools")]
    for region in answer:
        seen = region.HasField("state_age_s")
        age = f"{region.state_age_s:.1f} s" if seen else "-"
        # Healthy: its last state is fresh and says so; never seen is not the same as down.
        health = "healthy" if region.healthy else ("DOWN" if seen else "never seen")
        if not region.HasField("carbon"):
            carbon = "no signal"
        else:
            signal = region.carbon
            carbon = f"{signal.value:.0f} {signal.unit}, {signal.age_s / 60:.0f} min old" + (" STALE" if signal.stale else "")
        pools = ", ".join(f"{p.name} ({p.count}x {p.gpu})" for p in region.pools)
        rows.append((region.name, health, age, region.grid_zone, carbon, pools))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    return exit_codes.OK


def _kill_switch(args: argparse.Namespace, client: SchedulerClient) -> int:
    answer = client.set_energy_routing(args.energy_routing, reason=args.reason)
    state = ("off: energy and carbon ranking back ON" if answer.enabled
             else "on: energy and carbon ranking OFF, routing in the performance order")
    print(f"kill switch {state} (by {answer.updated_by} at {_when(answer.updated_at_unix_s)}); "
          f"every router sharing the store applies it within about a second")
    return exit_codes.OK
