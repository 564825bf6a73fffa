"""Why a provider gave no value: one closed set of reasons, used in log lines and as the
``reason`` label of the failure counter."""

from __future__ import annotations

from typing import Literal

Reason = Literal[
    "config",  # missing credentials or base URL
    "auth",  # 401/403 (after a fresh login, for WattTime)
    "rate_limited",  # 429 still refused after the retries, or Retry-After too long to wait
    "http_4xx",
    "http_5xx",
    "timeout",
    "connect",
    "invalid_json",
    "bad_field",  # a field missing, mistyped, or out of range
    "wrong_unit",
    "unknown_zone",
    "no_data",
    "store_unavailable",
    "internal",  # a bug in our code: logged with its traceback, never raised to the caller
]


class ProviderError(Exception):
    """One endpoint of one provider failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, provider: str, endpoint: str, reason: Reason, detail: str, status: int | None = None,
                 part: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(f"{provider} {endpoint}: {reason}: {detail}")
        self.provider = provider
        self.endpoint = endpoint
        self.reason: Reason = reason
        self.detail = detail
        self.status = status
        # Which part of a fetch failed (``base.LATEST``, ``FORECAST``, ``INDEX``); set by
        # ``base.attempt``, None for a failure outside any part.
        self.part = part
        # The wait a 429's ``Retry-After`` asked for.
        self.retry_after_s = retry_after_s

    def in_part(self, part: str) -> ProviderError:
        return ProviderError(self.provider, self.endpoint, self.reason, self.detail, self.status, part,
                             self.retry_after_s)


class FieldError(ValueError):
    """A response body does not have the documented shape; the message names the field."""
