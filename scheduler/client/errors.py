"""Typed errors the SDK raises, carrying the router's ``google.rpc`` status details."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass(frozen=True)
class PreconditionViolation:
    type: str  # the plugin that rejected
    subject: str  # region/pool/model
    description: str


class SchedulerRpcError(Exception):
    """A call the router answered with a non-OK status."""

    def __init__(self, code: grpc.StatusCode, message: str, details: tuple[Any, ...] = ()) -> None:
        self.code = code
        self.message = message
        # The unpacked google.rpc detail messages (BadRequest, PreconditionFailure, ...).
        self.details = details
        super().__init__(f"{code.name}: {message}")

    def _detail(self, kind: type[Any]) -> Any | None:
        return next((d for d in self.details if isinstance(d, kind)), None)

    @property
    def retry_after_s(self) -> float | None:
        info = self._detail(error_details_pb2.RetryInfo)
        return None if info is None else info.retry_delay.ToNanoseconds() / 1e9

    @property
    def error_info(self) -> dict[str, str]:
        info = self._detail(error_details_pb2.ErrorInfo)
        return {} if info is None else dict(info.metadata)


class InvalidArgumentError(SchedulerRpcError):
    @property
    def field_violations(self) -> list[FieldViolation]:
        bad = self._detail(error_details_pb2.BadRequest)
        return [] if bad is None else [FieldViolation(v.field, v.description) for v in bad.field_violations]


class UnschedulableError(SchedulerRpcError):
    """FAILED_PRECONDITION: no region satisfies the request's hard requirements."""

    @property
    def violations(self) -> list[PreconditionViolation]:
        failure = self._detail(error_details_pb2.PreconditionFailure)
        return [] if failure is None else [
            PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations]


class UnavailableError(SchedulerRpcError):
    @property
    def retryable(self) -> bool:
        """False when text had already been streamed (the request may have run)."""
        return self.error_info.get("retryable", "true") == "true"

    @property
    def attempts(self) -> list[dict[str, Any]]:
        raw = self.error_info.get("attempts")
        return json.loads(raw) if raw else []


class RateLimitedError(SchedulerRpcError):
    pass


class UnauthenticatedError(SchedulerRpcError):
    pass


class PermissionDeniedError(SchedulerRpcError):
    pass


class DeadlineExceededError(SchedulerRpcError):
    pass


class NotFoundError(SchedulerRpcError):
    """NOT_FOUND: no such deferred request for this key's tenant (unknown, expired or another's)."""


class InternalError(SchedulerRpcError):
    pass


ERRORS_BY_CODE: dict[grpc.StatusCode, type[SchedulerRpcError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: UnschedulableError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RateLimitedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INTERNAL: InternalError,
}

DETAIL_TYPES = (
    error_details_pb2.BadRequest, error_details_pb2.PreconditionFailure, error_details_pb2.ErrorInfo,
    error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure,
)


def _unpack(metadata: Iterable[tuple[str, Any]] | None) -> tuple[Any, ...]:
    for key, value in metadata or ():
        if key != DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        details = []
        for packed in status.details:
            for kind in DETAIL_TYPES:
                if packed.Is(kind.DESCRIPTOR):
                    message = kind()
                    packed.Unpack(message)
                    details.append(message)
        return tuple(details)
    return ()


def from_rpc_error(error: grpc.RpcError) -> SchedulerRpcError:
    """The typed error for a grpc (sync or aio) error."""
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    message: str = error.details() or ""  # type: ignore[attr-defined]
    details = _unpack(error.trailing_metadata())  # type: ignore[attr-defined, arg-type]
    return ERRORS_BY_CODE.get(code, SchedulerRpcError)(code, message, details)
