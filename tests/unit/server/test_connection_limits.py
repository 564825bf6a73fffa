"""The router's per-port limits from its flags: the documented defaults are the limits' own,
every flag reaches its port, and a bad value is an error naming the flag and the value."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.cli import build_parser
from scheduler.http.server import ServerLimits
from scheduler.server.app import GrpcLimits
from scheduler.server.cli import connection_limits
from scheduler.server.http_api import MAX_BODY_BYTES
from scheduler.server.metrics import METRICS_LIMITS

pytestmark = pytest.mark.timeout(10)


def limits(*flags: str) -> tuple[GrpcLimits, ServerLimits, ServerLimits]:
    return connection_limits(build_parser().parse_args(["router", *flags]))


def test_the_defaults_are_the_limits_own() -> None:
    assert limits() == (GrpcLimits(), ServerLimits(max_body_bytes=MAX_BODY_BYTES), METRICS_LIMITS)


def test_every_flag_reaches_its_port() -> None:
    grpc, http, metrics = limits(
        "--http-max-connections", "500", "--http-max-connections-per-client", "0", "--metrics-max-connections", "4",
        "--metrics-max-connections-per-client", "2", "--grpc-max-connections", "300",
        "--grpc-max-streams-per-connection", "10", "--header-timeout", "2", "--body-timeout", "3",
        "--idle-timeout", "4", "--write-timeout", "5")
    timeouts = {"header_timeout_s": 2.0, "body_timeout_s": 3.0, "idle_timeout_s": 4.0, "write_timeout_s": 5.0}
    assert http == ServerLimits(max_body_bytes=MAX_BODY_BYTES, max_connections=500, max_connections_per_client=0,
                                **timeouts)
    assert metrics == replace(METRICS_LIMITS, max_connections=4, max_connections_per_client=2, **timeouts)
    assert grpc == GrpcLimits(max_connections=300, max_streams_per_connection=10, handshake_timeout_s=2.0,
                              idle_timeout_s=4.0, write_timeout_s=5.0)
    assert ("grpc.max_allowed_incoming_connections", 300) in grpc.options()
    assert ("grpc.server_handshake_timeout_ms", 2000) in grpc.options()


@pytest.mark.parametrize("flag, value, message", [
    ("--http-max-connections", "0", "--http-max-connections: expected an integer >= 1, got 0"),
    ("--http-max-connections-per-client", "-1", "--http-max-connections-per-client: expected an integer >= 0, got -1"),
    ("--metrics-max-connections", "0", "--metrics-max-connections: expected an integer >= 1, got 0"),
    ("--grpc-max-streams-per-connection", "0", "--grpc-max-streams-per-connection: expected an integer >= 1, got 0"),
    ("--header-timeout", "0", "--header-timeout: expected seconds > 0, got 0.0"),
    ("--body-timeout", "-3", "--body-timeout: expected seconds > 0, got -3.0"),
    ("--idle-timeout", "inf", "--idle-timeout: expected seconds > 0, got inf"),
    ("--write-timeout", "nan", "--write-timeout: expected seconds > 0, got nan"),
], ids=lambda value: str(value))
def test_a_bad_value_names_the_flag(flag: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        limits(flag, value)
    assert str(refused.value) == message


@pytest.mark.parametrize("make, message", [
    (lambda: ServerLimits(max_connections=0), "ServerLimits.max_connections: expected an integer >= 1, got 0"),
    (lambda: ServerLimits(header_timeout_s=0), "ServerLimits.header_timeout_s: expected seconds > 0, got 0"),
    (lambda: GrpcLimits(max_message_bytes=0), "GrpcLimits.max_message_bytes: expected an integer >= 1, got 0"),
    (lambda: GrpcLimits(write_timeout_s=-1), "GrpcLimits.write_timeout_s: expected seconds > 0, got -1"),
], ids=["server-connections", "server-header-timeout", "grpc-message", "grpc-write-timeout"])
def test_the_limits_check_themselves(make: object, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        make()  # type: ignore[operator]
    assert str(refused.value) == message
