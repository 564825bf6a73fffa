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
from scheduler.client.errors import DETAIL_TYPES, ERRORS_BY_CODE, SchedulerRpcError
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

ROUTE_PATH = "/scheduler.v1.GlobalRouter/Route"
PROTO = "application/proto"
# An answer that is not a Connect error (a proxy in between, say): its code by HTTP status.
_CODE_BY_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                   403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.UNIMPLEMENTED,
                   429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE,
                   503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def route_call(http_url: str, request: pb.GenerateRequest, api_key: str | None,
               timeout_s: float | None) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) of the Route call."""
    headers = {"content-type": PROTO, "connect-protocol-version": "1"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if timeout_s is not None:
        headers["connect-timeout-ms"] = str(max(1, int(timeout_s * 1000)))
    return http_url.rstrip("/") + ROUTE_PATH, request.SerializeToString(), headers


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
