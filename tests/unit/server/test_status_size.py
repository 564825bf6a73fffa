"""Statuses stay small enough for gRPC's trailing metadata (clients refuse > 8 KiB): the
message is clipped, long lists are cut with a count, and the code always arrives."""

from __future__ import annotations

import base64

from scheduler import errors
from scheduler.server.status import MAX_STATUS_BYTES, status_for


def metadata_bytes(status) -> int:  # type: ignore[no-untyped-def]
    return sum(len(k) + (len(v) if isinstance(v, bytes | str) else 0) for k, v in status.trailing_metadata)


def test_an_unschedulable_answer_with_hundreds_of_rejections_fits() -> None:
    rejections = tuple(errors.RejectionReason(f"region-{i}/pool/model", "region-health", "x" * 200) for i in range(500))
    status = status_for(errors.Unschedulable("no candidate " + "y" * 5000, "region-health", rejections))
    assert metadata_bytes(status) < 8192
    raw = dict(status.trailing_metadata)["grpc-status-details-bin"]
    assert len(base64.b64encode(raw) if isinstance(raw, bytes) else raw) < MAX_STATUS_BYTES * 4 // 3 + 8
    assert status.details.endswith("…(clipped)")


def test_failover_attempts_with_tracebacks_fit_and_keep_their_code() -> None:
    attempts = tuple(errors.Attempt(f"r{i}", "p", "Traceback (most recent call last):\n" * 200, 503) for i in range(6))
    exc = errors.Unavailable("every candidate failed: " + "z" * 9000, attempts=attempts, retryable=True,
                             retry_after_s=1.0)
    status = status_for(exc)
    assert metadata_bytes(status) < 8192
    assert status.code.name == "UNAVAILABLE"
