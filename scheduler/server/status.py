"""The one place a ``scheduler.errors`` outcome becomes a gRPC status with ``google.rpc`` details.

- InvalidRequest   -> INVALID_ARGUMENT   + BadRequest (one field violation per bad field)
- Unschedulable    -> FAILED_PRECONDITION + PreconditionFailure (every candidate's rejection)
- Unavailable      -> UNAVAILABLE        + ErrorInfo (retryable, attempts) [+ RetryInfo]
- RateLimited      -> RESOURCE_EXHAUSTED + QuotaFailure + RetryInfo
- StreamLimited    -> RESOURCE_EXHAUSTED + QuotaFailure (concurrent streams)
- QuotaExceeded    -> RESOURCE_EXHAUSTED + QuotaFailure (the quota, its use and its limit)
- StorageRefused   -> FAILED_PRECONDITION + PreconditionFailure (one violation per jurisdiction)
- DeadlineExceeded -> DEADLINE_EXCEEDED
- Unauthenticated  -> UNAUTHENTICATED;  PermissionDenied -> PERMISSION_DENIED;  NotFound -> NOT_FOUND
- Replayed         -> its recorded code (UNKNOWN if the name is not a code)
- Internal / anything else -> INTERNAL (the message of an unexpected exception is not shown)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from scheduler import errors

log = logging.getLogger(__name__)

ERROR_DOMAIN = "scheduler.v1"
# A status travels in trailing metadata (grpc-message + base64 grpc-status-details-bin), which
# clients refuse beyond 8 KiB by default: the message is clipped, lists are cut with a count of
# what was left out, and as a last resort details that do not fit are dropped (the code and
# the clipped message always arrive).
MAX_MESSAGE_CHARS = 1000
MAX_STATUS_BYTES = 4000
MAX_LISTED = 20
MAX_ATTEMPT_ERROR_CHARS = 300


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 12] + " …(clipped)"


def _pack(*details: object) -> list[any_pb2.Any]:
    packed = []
    for detail in details:
        message = any_pb2.Any()
        message.Pack(detail)  # type: ignore[arg-type]
        packed.append(message)
    return packed


def _retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def _invalid(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.InvalidRequest)
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in exc.violations
        ]
    )
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(exc), details=_pack(bad))


def _unschedulable(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.Unschedulable)
    failure = error_details_pb2.PreconditionFailure(
        violations=[
            error_details_pb2.PreconditionFailure.Violation(type=r.plugin, subject=r.subject, description=r.reason)
            for r in exc.rejections[:MAX_LISTED]
        ]
    )
    if len(exc.rejections) > MAX_LISTED:
        failure.violations.add(type="", subject="", description=f"{len(exc.rejections) - MAX_LISTED} more not listed")
    info = error_details_pb2.ErrorInfo(reason="UNSCHEDULABLE", domain=ERROR_DOMAIN, metadata={"plugin": exc.plugin})
    return status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=str(exc), details=_pack(failure, info))


def _unavailable(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.Unavailable)
    attempts = [{"region": a.region, "pool": a.pool, "error": clip(a.error, MAX_ATTEMPT_ERROR_CHARS),
                 "http_status": a.http_status} for a in exc.attempts[:MAX_LISTED]]
    info = error_details_pb2.ErrorInfo(
        reason="REGIONS_UNAVAILABLE" if exc.retryable else "STREAM_INTERRUPTED",
        domain=ERROR_DOMAIN,
        metadata={"retryable": str(exc.retryable).lower(), "attempts": json.dumps(attempts)},
    )
    details: list[object] = [info]
    if exc.retry_after_s is not None:
        details.append(_retry_info(exc.retry_after_s))
    return status_pb2.Status(code=code_pb2.UNAVAILABLE, message=str(exc), details=_pack(*details))


def _rate_limited(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.RateLimited)
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(
            subject=f"tenant:{exc.tenant}", description=f"limit {exc.limit_rps:g} requests/s")]
    )
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(exc),
                             details=_pack(quota, _retry_info(exc.retry_after_s)))


def _stream_limited(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.StreamLimited)
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(
            subject=f"tenant:{exc.tenant}", description=f"limit {exc.limit_streams} concurrent streams")]
    )
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(exc), details=_pack(quota))


def _budget_exhausted(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.BudgetExhausted)
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(
            subject=f"tenant:{exc.tenant}",
            description=f"hard {exc.what} budget for {exc.month}: used {exc.used:,.0f} of {exc.limit:,.0f}")]
    )
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(exc), details=_pack(quota))


def _quota_exceeded(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.QuotaExceeded)
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(
            subject=f"tenant:{exc.tenant}", description=f"{exc.quota}: {exc.used:,} of {exc.limit:,} {exc.unit}")]
    )
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(exc), details=_pack(quota))


def _storage_refused(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.StorageRefused)
    failure = error_details_pb2.PreconditionFailure(
        violations=[error_details_pb2.PreconditionFailure.Violation(
            type="deferral-storage", subject=f"jurisdiction:{code}", description=str(exc))
            for code in exc.jurisdictions[:MAX_LISTED]]
    )
    return status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=str(exc), details=_pack(failure))


def _replayed(exc: errors.SchedulerError) -> status_pb2.Status:
    assert isinstance(exc, errors.Replayed)
    value = code_pb2.Code.DESCRIPTOR.values_by_name.get(exc.code)
    return status_pb2.Status(code=code_pb2.UNKNOWN if value is None else value.number, message=str(exc))


def _plain(code: int) -> Callable[[errors.SchedulerError], status_pb2.Status]:
    def build(exc: errors.SchedulerError) -> status_pb2.Status:
        return status_pb2.Status(code=code, message=str(exc))

    return build


STATUS_BUILDERS: Mapping[type[errors.SchedulerError], Callable[[errors.SchedulerError], status_pb2.Status]] = (
    MappingProxyType({
        errors.InvalidRequest: _invalid,
        errors.Unschedulable: _unschedulable,
        errors.Unavailable: _unavailable,
        errors.RateLimited: _rate_limited,
        errors.StreamLimited: _stream_limited,
        errors.BudgetExhausted: _budget_exhausted,
        errors.QuotaExceeded: _quota_exceeded,
        errors.StorageRefused: _storage_refused,
        errors.Unauthenticated: _plain(code_pb2.UNAUTHENTICATED),
        errors.PermissionDenied: _plain(code_pb2.PERMISSION_DENIED),
        errors.NotFound: _plain(code_pb2.NOT_FOUND),
        errors.Replayed: _replayed,
        errors.Internal: _plain(code_pb2.INTERNAL),
        errors.DeadlineExceeded: _plain(code_pb2.DEADLINE_EXCEEDED),
    })
)


def rpc_status_for(exc: BaseException) -> status_pb2.Status:
    """The ``google.rpc.Status`` (code, clipped message, packed details) for an exception:
    what the gRPC edge sends in trailing metadata and the HTTP edge as a Connect error."""
    builder = next((STATUS_BUILDERS[k] for k in type(exc).__mro__ if k in STATUS_BUILDERS), None)
    if builder is None or not isinstance(exc, errors.SchedulerError):
        log.exception("unexpected error in the router", exc_info=exc)
        status = status_pb2.Status(code=code_pb2.INTERNAL, message="internal error in the router")
    else:
        status = builder(exc)
    status.message = clip(status.message, MAX_MESSAGE_CHARS)
    if status.ByteSize() > MAX_STATUS_BYTES:
        kept = [d for d in status.details]
        del status.details[:]
        for detail in kept:
            if status.ByteSize() + detail.ByteSize() + 8 <= MAX_STATUS_BYTES:
                status.details.append(detail)
    return status


def status_for(exc: BaseException) -> grpc.Status:
    """The gRPC status (with packed details in its trailing metadata) for an exception."""
    result: grpc.Status = rpc_status.to_status(rpc_status_for(exc))
    return result
