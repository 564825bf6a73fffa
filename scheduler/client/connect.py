"""``Route`` over the router's HTTP front door, as a Connect-protocol unary call
(connectrpc.com/docs/protocol): ``POST {http_url}/scheduler.v1.GlobalRouter/Route`` with the
``GenerateRequest`` as protobuf, the ``RouteResponse`` back. Direct mode uses it when the
client is given the router's HTTP address: on a kept-alive connection it costs the router (and
the client) a fraction of a gRPC call. A Connect error (``{"code", "message", "details"}``)
becomes the same typed ``SchedulerRpcError`` a gRPC status does.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from scheduler.client.common import TlsConfig
from scheduler.client.errors import DETAIL_TYPES, ERRORS_BY_CODE, SchedulerRpcError, UnavailableError
from scheduler.envelope import COMPRESSED, CONNECT_PROTO, END_STREAM, EnvelopeError, EnvelopeReader, envelope
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

ROUTE_PATH = "/scheduler.v1.GlobalRouter/Route"
GENERATE_PATH = "/scheduler.v1.GlobalRouter/Generate"
PROTO = "application/proto"
# The largest message of a Generate stream the SDK accepts (a full decision is tens of KB).
MAX_STREAM_MESSAGE_BYTES = 16 * 2**20
# A stream silent this long past its deadline has lost its router; without a deadline, the
# router's longest stream (max_stream_s) bounds it.
DEADLINE_MARGIN_S = 5.0
STREAM_SILENCE_S = 600.0
# An answer that is not a Connect error (a proxy in between, say): its code by HTTP status.
_CODE_BY_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                   403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.UNIMPLEMENTED,
                   429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE,
                   503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def _headers(content_type: str, api_key: str | None, timeout_s: float | None) -> dict[str, str]:
    headers = {"content-type": content_type, "connect-protocol-version": "1"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if timeout_s is not None:
        headers["connect-timeout-ms"] = str(max(1, int(timeout_s * 1000)))
    return headers


def route_call(http_url: str, request: pb.GenerateRequest, api_key: str | None,
               timeout_s: float | None) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) of the Route call."""
    return http_url.rstrip("/") + ROUTE_PATH, request.SerializeToString(), _headers(PROTO, api_key, timeout_s)


def generate_call(http_url: str, request: pb.GenerateRequest, api_key: str | None,
                  timeout_s: float | None) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) of a Generate call (Connect server-streaming: one envelope out)."""
    return (http_url.rstrip("/") + GENERATE_PATH, envelope(request.SerializeToString()),
            _headers(CONNECT_PROTO, api_key, timeout_s))


def read_timeout_s(timeout_s: float | None) -> float:
    """The longest silence a Generate stream may have: past the call's deadline (when the router
    ends it) by a margin; without a deadline, the router's own longest stream."""
    return STREAM_SILENCE_S if timeout_s is None else timeout_s + DEADLINE_MARGIN_S


class GenerateEvents:
    """The messages of a Generate stream's body, fed as it arrives; ``finish`` at its end raises
    the error the stream ended with (or that it was cut before its end)."""

    def __init__(self) -> None:
        self._reader = EnvelopeReader(MAX_STREAM_MESSAGE_BYTES)
        self._end: bytes | None = None

    def feed(self, data: bytes) -> list[pb.GenerateResponse]:
        events = []
        try:
            envelopes = self._reader.feed(data)
        except EnvelopeError as exc:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"malformed Generate stream: {exc}") from None
        for flags, message in envelopes:
            if self._end is not None:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "malformed Generate stream: data after its end")
            if flags & END_STREAM:
                self._end = message
            elif flags & COMPRESSED:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "compressed message: none was asked for")
            else:
                events.append(pb.GenerateResponse.FromString(message))
        return events

    def finish(self) -> None:
        if self._end is None:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "the Generate stream was cut before its end")
        try:
            end = json.loads(self._end)
        except ValueError:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "malformed end of the Generate stream") from None
        error = end.get("error") if isinstance(end, dict) else None
        if error is not None:
            raise connect_error(200, json.dumps(error).encode())


def route_answer(status: int, headers: Mapping[str, str], body: bytes) -> router_pb2.RouteResponse:
    """The ``RouteResponse``, or the typed error the answer stands for."""
    if status == 200 and headers.get("content-type", "").startswith(PROTO):
        return router_pb2.RouteResponse.FromString(body)
    raise connect_error(status, body)


def connect_error(status: int, body: bytes) -> SchedulerRpcError:
    try:
        error = json.loads(body)
        code = grpc.StatusCode[str(error["code"]).upper()]
        message = str(error.get("message", ""))
        details = tuple(_unpack(d) for d in error.get("details") or ())
    except (ValueError, KeyError, TypeError, AttributeError):
        code = _CODE_BY_STATUS.get(status, grpc.StatusCode.UNKNOWN)
        message = f"HTTP {status}: {body[:200].decode('utf-8', errors='replace')}"
        details = ()
    return ERRORS_BY_CODE.get(code, SchedulerRpcError)(code, message, tuple(d for d in details if d is not None))


def _unpack(detail: Mapping[str, Any]) -> Any | None:
    kind = next((k for k in DETAIL_TYPES if k.DESCRIPTOR.full_name == detail.get("type")), None)
    value = detail.get("value")
    if kind is None or not isinstance(value, str):
        return None
    return kind.FromString(base64.b64decode(value + "=" * (-len(value) % 4)))


def ssl_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """The client's TLS settings for HTTPS (None: the system's roots)."""
    if tls is None:
        return None
    ca = tls.ca_cert
    context = ssl.create_default_context(cadata=(ca if isinstance(ca, bytes) else Path(ca).read_bytes()).decode()
                                         if ca is not None else None)
    if tls.client_cert is not None and tls.client_key is not None:
        with tempfile.TemporaryDirectory() as folder:
            cert, key = _file(folder, "cert.pem", tls.client_cert), _file(folder, "key.pem", tls.client_key)
            context.load_cert_chain(cert, key)
    return context


def _file(folder: str, name: str, value: Path | bytes) -> Path:
    if isinstance(value, bytes):
        path = Path(folder, name)
        path.write_bytes(value)
        return path
    return Path(value)
