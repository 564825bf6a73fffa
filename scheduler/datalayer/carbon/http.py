"""JSON over ``httpx.AsyncClient`` with timeouts, retries and jittered backoff.

Retried (``scheduler.wire.retry``): timeouts, connection errors, 429 and 5xx (500, 502, 503,
504). Not retried: other 4xx (the request itself is wrong; retrying cannot help). A 429's
``Retry-After`` (seconds or an HTTP date) is waited for exactly, unless it is longer than the
policy's ``max_hint_s``: then we give up at once and the poller tries at its next round.
Otherwise the wait is "equal jitter" exponential backoff (scheduler.wire.retry). The RNG, the sleep and the clock are
injected, so tests run the real code without waiting.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from scheduler.datalayer.carbon.errors import ProviderError, Reason
from scheduler.wire.retry import RetryPolicy, Sleep, retry_after_s, retry_async

Clock = Callable[[], float]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_REASONS = frozenset({"timeout", "connect"})
# The providers' policy: they answer in seconds, and one may ask for up to a minute's pause.
PROVIDER_RETRY = RetryPolicy(attempts=3, initial_backoff_s=0.5, max_backoff_s=8.0, max_hint_s=60.0)
# Enough of an error body to say what the server meant, never a whole page.
ERROR_EXCERPT_CHARS = 300


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
    retry: RetryPolicy = PROVIDER_RETRY
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
        return await retry_async(lambda: self._get_once(path, params, headers, auth), self.retry, self._retryable,
                                 hint_s=_retry_after, sleep=self.sleep, rng=self.rng)

    async def _get_once(
        self,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        auth: httpx.Auth | tuple[str, str] | None,
    ) -> httpx.Response:
        try:
            response = await self.client.get(path, params=params, headers=headers, auth=auth)
        except httpx.TimeoutException as exc:
            raise ProviderError(self.provider, path, "timeout", f"no answer within the timeout ({exc!r})") from None
        except httpx.TransportError as exc:
            raise ProviderError(self.provider, path, "connect", repr(exc)) from None
        if response.is_success:
            return response
        status = response.status_code
        wait_s = retry_after_s(response.headers.get("Retry-After"), self.clock()) if status == 429 else None
        if wait_s is not None and wait_s > self.retry.max_hint_s:
            raise ProviderError(
                self.provider, path, "rate_limited",
                f"HTTP 429, Retry-After {wait_s:.0f} s is longer than we wait ({self.retry.max_hint_s:.0f} s)",
                status, retry_after_s=wait_s,
            )
        raise ProviderError(self.provider, path, _status_reason(status), f"HTTP {status}: {error_excerpt(response)}",
                            status, retry_after_s=wait_s)

    def _retryable(self, error: Exception) -> bool:
        if not isinstance(error, ProviderError):
            return False
        if error.retry_after_s is not None and error.retry_after_s > self.retry.max_hint_s:
            return False  # longer than we wait: the poller tries at its next round
        return error.reason in RETRY_REASONS or error.status in RETRY_STATUSES

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


def _retry_after(error: Exception) -> float | None:
    return error.retry_after_s if isinstance(error, ProviderError) else None
