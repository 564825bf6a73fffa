"""JSON over ``httpx.AsyncClient`` with timeouts, retries and jittered backoff.

Retried: timeouts, connection errors, 429 and 5xx (500, 502, 503, 504). Not retried: other
4xx (the request itself is wrong; retrying cannot help). A 429's ``Retry-After`` (seconds or
an HTTP date, RFC 9110 section 10.2.3) is waited for exactly, unless it is longer than
``max_retry_after_s``: then we give up at once and the poller tries at its next round.
Otherwise the wait is "full jitter" exponential backoff: uniform(0, min(max, base x 2^n)).
The RNG, the sleep and the clock are injected, so tests run the real code without waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from scheduler.datalayer.carbon.errors import ProviderError, Reason

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Enough of an error body to say what the server meant, never a whole page.
ERROR_EXCERPT_CHARS = 300


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_retry_after_s: float = 60.0

    def backoff(self, retry: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2.0**retry))


def retry_after_s(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from ``now``; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def error_excerpt(response: httpx.Response) -> str:
    """The message of a JSON error body (the field names the providers use), else its text."""
    text = response.text[:ERROR_EXCERPT_CHARS]
    try:
        body = json.loads(response.text)
    except ValueError:
        return text.strip() or "(empty body)"
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict):  # UK Carbon Intensity: {"error": {"code", "message"}}
            body = nested
        parts = [str(body[k]) for k in ("error", "title", "code", "message", "detail") if isinstance(body.get(k), str)]
        errors = body.get("errors")  # ASP.NET ValidationProblemDetails (Carbon Aware SDK)
        if isinstance(errors, dict):
            parts.extend(f"{k}: {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in errors.items())
        if parts:
            return "; ".join(parts)[:ERROR_EXCERPT_CHARS]
    return text


def _status_reason(status: int) -> Reason:
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate_limited"
    return "http_5xx" if status >= 500 else "http_4xx"


@dataclass
class JsonHttp:
    """GET JSON from one provider; raises ``ProviderError`` with a reason, never anything else
    for a network or HTTP failure."""

    client: httpx.AsyncClient
    provider: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    rng: random.Random = field(default_factory=random.Random)
    sleep: Sleep = asyncio.sleep
    clock: Clock = time.time

    async def get(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | tuple[str, str] | None = None,
    ) -> httpx.Response:
        """The first 2xx response, after retrying what may pass."""
        attempts = max(1, self.retry.attempts)
        for attempt in range(attempts):
            wait: float | None = None
            try:
                response = await self.client.get(path, params=params, headers=headers, auth=auth)
            except httpx.TimeoutException as exc:
                error = ProviderError(self.provider, path, "timeout", f"no answer within the timeout ({exc!r})")
            except httpx.TransportError as exc:
                error = ProviderError(self.provider, path, "connect", repr(exc))
            else:
                if response.is_success:
                    return response
                status = response.status_code
                error = ProviderError(
                    self.provider, path, _status_reason(status), f"HTTP {status}: {error_excerpt(response)}", status
                )
                if status not in RETRY_STATUSES:
                    raise error
                if status == 429:
                    wait = retry_after_s(response.headers.get("Retry-After"), self.clock())
                    if wait is not None and wait > self.retry.max_retry_after_s:
                        raise ProviderError(
                            self.provider, path, "rate_limited",
                            f"HTTP 429, Retry-After {wait:.0f} s is longer than we wait "
                            f"({self.retry.max_retry_after_s:.0f} s)", status,
                        )
            if attempt + 1 == attempts:
                raise error
            delay = wait if wait is not None else self.retry.backoff(attempt, self.rng)
            log.info("%s; retry %d/%d in %.2f s", error, attempt + 1, attempts - 1, delay)
            await self.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    async def get_json(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | tuple[str, str] | None = None,
    ) -> Any:
        response = await self.get(path, params, headers, auth)
        if not response.content.strip():
            raise ProviderError(self.provider, path, "no_data", f"empty body (HTTP {response.status_code})")
        try:
            return json.loads(response.content)
        except (ValueError, UnicodeDecodeError) as exc:
            excerpt = response.text[:80].replace("\n", " ")
            raise ProviderError(self.provider, path, "invalid_json", f"{exc} (body starts {excerpt!r})") from None

    async def aclose(self) -> None:
        await self.client.aclose()
