"""Each outcome maps to one gRPC status with google.rpc details."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from scheduler import errors
from scheduler.server.status import status_for


def _details(status: grpc.Status) -> tuple[status_pb2.Status, list[object]]:
    raw = dict(status.trailing_metadata)["grpc-status-details-bin"]
    parsed = status_pb2.Status.FromString(raw)
    unpacked: list[object] = []
    for any_ in parsed.details:
        for kind in (error_details_pb2.BadRequest, error_details_pb2.PreconditionFailure,
                     error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure):
            if any_.Is(kind.DESCRIPTOR):
                message = kind()
                any_.Unpack(message)
                unpacked.append(message)
    return parsed, unpacked


def test_invalid_request_lists_field_violations() -> None:
    status = status_for(errors.InvalidRequest([errors.FieldViolation("sampling.max_tokens", "must be > 0")]))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    _, details = _details(status)
    assert isinstance(details[0], error_details_pb2.BadRequest)
    assert details[0].field_violations[0].field == "sampling.max_tokens"


def test_unschedulable_lists_every_rejection() -> None:
    rejections = (errors.RejectionReason("us-east/h100/llama", "residency-filter", "US not in [EU]"),
                  errors.RejectionReason("ap-se/l4/llama", "residency-filter", "SG not in [EU]"))
    status = status_for(errors.Unschedulable("none", "residency-filter", rejections))
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION
    _, details = _details(status)
    failure = details[0]
    assert isinstance(failure, error_details_pb2.PreconditionFailure)
    assert [(v.type, v.subject) for v in failure.violations] == [
        ("residency-filter", "us-east/h100/llama"), ("residency-filter", "ap-se/l4/llama")]


def test_unavailable_and_rate_limited_carry_retry_information() -> None:
    status = status_for(errors.Unavailable("down", (errors.Attempt("eu", "p", "refused"),), retry_after_s=1.0))
    assert status.code == grpc.StatusCode.UNAVAILABLE
    _, details = _details(status)
    assert any(isinstance(d, error_details_pb2.RetryInfo) for d in details)
    info = next(d for d in details if isinstance(d, error_details_pb2.ErrorInfo))
    assert info.metadata["retryable"] == "true" and "refused" in info.metadata["attempts"]
    limited = status_for(errors.RateLimited("acme", 5.0, 0.2))
    assert limited.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_unexpected_exceptions_are_internal_without_their_message() -> None:
    status = status_for(RuntimeError("secret prompt text"))
    assert status.code == grpc.StatusCode.INTERNAL
    assert "secret" not in status.details
    assert status_for(errors.Unauthenticated("no key")).code == grpc.StatusCode.UNAUTHENTICATED
    assert status_for(errors.PermissionDenied("no")).code == grpc.StatusCode.PERMISSION_DENIED
