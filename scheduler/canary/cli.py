"""``scheduler canary status | enable | disable``: the router's canary over RouterAdmin (an admin key).

    scheduler canary status --router router:50051 --api-key $ADMIN_KEY
    scheduler canary enable --reason "fixed the slow region"     # after a rollback: a new epoch
    scheduler canary disable --reason "pausing the trial"

The key comes from ``--api-key`` or ``$SCHEDULER_API_KEY``; a router on TLS takes ``--tls-ca``
(and ``--tls-cert``/``--tls-key`` for mutual TLS). ``status --json`` prints the answer as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

API_KEY_ENV = "SCHEDULER_API_KEY"


def register(sub: Any) -> None:
    canary = sub.add_parser("canary", help="the router policy's canary: status, re-enable after a rollback, switch off")
    actions = canary.add_subparsers(dest="canary_command", required=True, metavar="ACTION")
    status = actions.add_parser("status", help="the canary's split, whether its arm is on, each arm's figures")
    _connection(status)
    status.add_argument("--json", action="store_true", help="print the answer as JSON")
    status.set_defaults(handler=_status)
    for name, enabled, text in (("enable", True, "turn the canary arm back on (after a rollback): a new epoch, "
                                                  "its windows start empty"),
                                ("disable", False, "switch the canary arm off on every router (until enabled)")):
        action = actions.add_parser(name, help=text)
        _connection(action)
        action.add_argument("--reason", default="", help="why (logged, stored and in the audit stream)")
        action.set_defaults(handler=_set, enabled=enabled)


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router", default="127.0.0.1:50051", help="the router's gRPC address (default 127.0.0.1:50051)")
    parser.add_argument("--api-key", default=None, help=f"an admin key (default ${API_KEY_ENV})")
    parser.add_argument("--tls-ca", type=Path, help="CA that signed the router's certificate (TLS)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", type=Path, help="client key (mutual TLS)")
    parser.add_argument("--server-name", help="verify the router as this name (TLS)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")


def _read(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


def _call(args: argparse.Namespace, method: str, request: Any) -> Any:
    # grpc directly, not the SDK (scheduler.client): this package sits below the server, which
    # the SDK's direct mode imports.
    import grpc

    from scheduler.v1 import admin_pb2_grpc

    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    if args.tls_ca or args.tls_cert:
        credentials = grpc.ssl_channel_credentials(root_certificates=_read(args.tls_ca),
                                                   private_key=_read(args.tls_key),
                                                   certificate_chain=_read(args.tls_cert))
        channel = grpc.secure_channel(args.router, credentials, options=options)
    else:
        channel = grpc.insecure_channel(args.router)
    with channel:
        stub = admin_pb2_grpc.RouterAdminStub(channel)  # type: ignore[no-untyped-call]
        key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
        metadata = (("authorization", f"Bearer {key}"),) if key else ()
        return getattr(stub, method)(request, metadata=metadata, timeout=args.timeout)


def _failed(exc: Exception) -> int:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    name = code().name if callable(code) else type(exc).__name__
    print(f"canary: {name}: {details() if callable(details) else exc}", file=sys.stderr)
    return 1


def _status(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    from scheduler.v1 import admin_pb2

    try:
        answer = _call(args, "GetCanaryStatus", admin_pb2.GetCanaryStatusRequest())
    except grpc.RpcError as exc:
        return _failed(exc)
    if args.json:
        print(json.dumps(MessageToDict(answer, preserving_proto_field_name=True), indent=2))
    else:
        print(render_status(answer, time.time()))
    return 0


def _set(args: argparse.Namespace) -> int:
    import grpc

    from scheduler.v1 import admin_pb2

    try:
        answer = _call(args, "SetCanaryArm", admin_pb2.SetCanaryArmRequest(enabled=args.enabled, reason=args.reason))
    except grpc.RpcError as exc:
        return _failed(exc)
    print(f"policy {answer.policy}: canary arm {answer.arm} {'ON' if answer.enabled else 'OFF'} (epoch {answer.epoch}, "
          f"by {answer.updated_by} at {_when(answer.updated_at_unix_s)}); every router applies it within 1 s")
    return 0


def _when(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if unix_s else "-"


def _share(message: Any, name: str, percent: bool) -> str:
    if not message.HasField(name):
        return "-"
    value = getattr(message, name)
    return f"{value * 100:.1f} %" if percent else f"{value:.4g}"


def render_status(answer: Any, now: float) -> str:
    """The GetCanaryStatus answer as text."""
    if not answer.configured:
        return f"policy {answer.policy}: no canary (add a `canary:` section to its file; docs/canary.md)"
    lines = [f"policy {answer.policy}: canary arm {answer.arm} on {answer.fraction * 100:g} % of the "
             f"{answer.assign_by} keys",
             f"state: {answer.state}" + (f" ({answer.reason})" if answer.reason else "")]
    if answer.updated_at_unix_s:
        lines.append(f"last change: {_when(answer.updated_at_unix_s)} by {answer.updated_by or '?'}")
    read = f"{now - answer.read_at_unix_s:.1f} s ago" if answer.read_at_unix_s else "not yet"
    lines.append(f"epoch {answer.epoch or '-'}; read from the store {read}")
    header = f"{'window':<24} {'arm':<8} {'policy':<16} {'requests':>8} {'ttft-slo':>9} {'errors':>8} " \
             f"{'retries':>8} {'J/req':>9} {'gCO2e/req':>10}"
    lines += ["", header]
    spans = [("judged", answer.judged)] if answer.HasField("judged") else []
    spans += [("current" if i == 0 else "previous", w) for i, w in enumerate(answer.windows)]
    for label, window in spans:
        name = f"{label} {_when(window.start_unix_s)[11:19]}+{window.length_s:g}s"
        for arm in window.arms:
            lines.append(f"{name:<24} {arm.arm:<8} {arm.policy:<16} {arm.requests:>8} "
                         f"{_share(arm, 'ttft_slo_attainment', True):>9} {_share(arm, 'error_rate', True):>8} "
                         f"{_share(arm, 'retry_rate', True):>8} {_share(arm, 'energy_j_per_request', False):>9} "
                         f"{_share(arm, 'gco2e_per_request', False):>10}")
    if answer.thresholds:
        lines += ["", "rolls back when:"] + [f"  {line}" for line in answer.thresholds]
    return "\n".join(lines)
