"""The closed set of outcomes a request can fail with, independent of any transport.

The router maps each to a gRPC status once, at its edge (``scheduler.server.status``); the
simulator and the CLI report them directly. No grpc imports here.
"""

from __future__ import annotations

from dataclasses import dataclass


class SchedulerError(Exception):
    """Base of every outcome below."""


@dataclass(frozen=True)
class FieldViolation:
    """One bad request field: ``field`` is its path in the request (e.g. ``sampling.max_tokens``)."""

    field: str
    description: str


# An answer about a bad request stays small whatever the request held (a hostile request must
# not make the router build, or the client receive, megabytes of error details).
MAX_VIOLATIONS = 20
MAX_FIELD_CHARS = 120
MAX_DESCRIPTION_CHARS = 300


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class InvalidRequest(SchedulerError):
    """The request itself is wrong; retrying it unchanged cannot succeed. At most
    ``MAX_VIOLATIONS`` violations are kept (clipped), the rest summarised in one."""

    def __init__(self, violations: tuple[FieldViolation, ...] | list[FieldViolation]) -> None:
        clipped = [FieldViolation(_clip(v.field, MAX_FIELD_CHARS), _clip(v.description, MAX_DESCRIPTION_CHARS))
                   for v in violations[:MAX_VIOLATIONS]]
        if len(violations) > MAX_VIOLATIONS:
            clipped.append(FieldViolation("request", f"and {len(violations) - MAX_VIOLATIONS:,} more violations"))
        self.violations = tuple(clipped)
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))


@dataclass(frozen=True)
class RejectionReason:
    """Why one candidate (``subject``, e.g. ``eu-north/h200-long``) was ruled out, by which plugin."""

    subject: str
    plugin: str
    reason: str


class Unschedulable(SchedulerError):
    """No candidate survived the hard filters (compliance, context, health, SLO).

    ``reason``/``plugin`` summarise (the plugin that rejected most); ``rejections`` lists every
    candidate's rejection so the caller can see what to change.
    """

    def __init__(self, reason: str, plugin: str, rejections: tuple[RejectionReason, ...] = ()) -> None:
        self.reason = reason
        self.plugin = plugin
        self.rejections = rejections
        super().__init__(reason)


@dataclass(frozen=True)
class Attempt:
    """A region tried and left: ``http_status`` 0 when no HTTP response came (connect error, timeout)."""

    region: str
    pool: str
    error: str
    http_status: int = 0


class Unavailable(SchedulerError):
    """Every candidate failed before the first token, or the chosen one failed after it.

    ``retryable`` is True when nothing reached the client yet (a retry is safe).
    """

    def __init__(self, message: str, attempts: tuple[Attempt, ...] = (), retryable: bool = True,
                 retry_after_s: float | None = None) -> None:
        self.attempts = attempts
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        super().__init__(message)


class DeadlineExceeded(SchedulerError):
    """The stream ran past its deadline (the client's, or the router's longest stream
    duration); what was generated until then is billed with a partial receipt."""


class RateLimited(SchedulerError):
    """The tenant sent more requests than its rate allows; ``retry_after_s`` says when to retry."""

    def __init__(self, tenant: str, limit_rps: float, retry_after_s: float) -> None:
        self.tenant = tenant
        self.limit_rps = limit_rps
        self.retry_after_s = retry_after_s
        super().__init__(f"tenant {tenant!r} is over its rate limit of {limit_rps:g} requests/s")


class StreamLimited(SchedulerError):
    """The tenant already holds as many concurrent Generate streams on this router as it may
    (fair use of the router's dispatch connections); retry when one of them ends."""

    def __init__(self, tenant: str, limit_streams: int) -> None:
        self.tenant = tenant
        self.limit_streams = limit_streams
        super().__init__(f"tenant {tenant!r} already has {limit_streams} concurrent Generate streams "
                         f"on this router, its limit")


class BudgetExhausted(SchedulerError):
    """The tenant passed its hard monthly energy or carbon budget; the router answers
    RESOURCE_EXHAUSTED (workload classes the policy marks critical are never refused)."""

    def __init__(self, tenant: str, month: str, what: str, used: float, limit: float) -> None:
        self.tenant, self.month, self.what, self.used, self.limit = tenant, month, what, used, limit
        super().__init__(f"tenant {tenant!r} used {used:,.0f} of its hard {what} budget {limit:,.0f} for {month}")


class QuotaExceeded(SchedulerError):
    """The tenant keeps as much in the store as a quota allows (``quota``: its name, e.g.
    ``deferral max_held``); what it asked for would pass it. RESOURCE_EXHAUSTED."""

    def __init__(self, tenant: str, quota: str, used: int, limit: int, unit: str, message: str) -> None:
        self.tenant, self.quota, self.used, self.limit, self.unit = tenant, quota, used, limit, unit
        super().__init__(message)


class StorageRefused(SchedulerError):
    """The request's data may not be kept in this router's store (its jurisdictions are bound
    to another store): nothing was kept. FAILED_PRECONDITION, naming the jurisdictions."""

    def __init__(self, jurisdictions: tuple[str, ...], message: str) -> None:
        self.jurisdictions = jurisdictions
        super().__init__(message)


class Internal(SchedulerError):
    """A bug or an unexpected failure inside the router; the message is safe to show."""


class Unauthenticated(SchedulerError):
    """No API key, or one the router does not know."""


class PermissionDenied(SchedulerError):
    """A known key without the right: a tenant key on the admin API, or naming another tenant."""


class NotFound(SchedulerError):
    """Nothing by that name for this caller: a deferred request unknown, expired, or another
    tenant's (which is not told apart from unknown)."""


class Replayed(SchedulerError):
    """An outcome recorded earlier, answered again with its code: a deferred request whose run
    failed, fetched later (``code``: the ``google.rpc.Code`` name, e.g. ``UNAVAILABLE``)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)
