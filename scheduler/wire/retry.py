"""Trying a call again when it failed in a way that may pass: the one retry policy of the SDK's
clients and of the data layer's HTTP calls to the carbon providers.

Between attempts the caller waits

- what the server asked for, when it said (HTTP's ``Retry-After``, seconds or an HTTP date,
  RFC 9110 section 10.2.3; the router's gRPC ``google.rpc.RetryInfo``, which its Connect
  errors carry too), but never longer than ``max_hint_s``;
- else an "equal jitter" exponential backoff: with cap = min(max_backoff_s, initial_backoff_s x
  2^n) before retry n (0 the first), uniform(cap / 2, cap). Clients that failed together do
  not retry together, and the attempts still span at least half the time the caller sized
  them for: full jitter, uniform(0, cap), halves that time on average, and 8 attempts sized
  to ride out a router restart (tests/faults/test_fault_suite.py) then ran out before it.

A call is tried at most ``attempts`` times, and an error the caller does not call retryable
is raised at once. The random source and the sleep are injected, so tests run the real code
without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

# The jitter of callers that do not inject their own random source.
JITTER = random.Random()


@dataclass(frozen=True)
class RetryPolicy:
    """How often a call is tried and how long apart (module doc). The defaults are the SDK's;
    the data layer's carbon providers use their own (``PROVIDER_RETRY``)."""

    attempts: int = 3
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    # The longest a server's hint is waited for; a longer one is cut to this.
    max_hint_s: float = 2.0

    def delay_s(self, retry: int, hint_s: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry ``retry`` (0: the first): the server's hint, capped,
        else equal-jitter backoff."""
        if hint_s is not None:
            return min(max(0.0, hint_s), self.max_hint_s)
        cap = min(self.max_backoff_s, self.initial_backoff_s * 2.0**retry)
        return rng.uniform(cap / 2.0, cap)

    def retries_after(self, attempt: int) -> bool:
        """Whether attempt number ``attempt`` (0: the first) may be followed by another."""
        return attempt + 1 < self.attempts


def no_hint(error: Exception) -> float | None:
    """For errors that carry no retry hint: always back off."""
    return None


def retry_after_s(value: str | None, now: float) -> float | None:
    """An HTTP ``Retry-After`` as seconds from ``now`` (0 for a date passed); None when absent
    or unreadable."""
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


def _next_delay_s(policy: RetryPolicy, attempt: int, error: Exception, retryable: Callable[[Exception], bool],
                  hint_s: Callable[[Exception], float | None], rng: random.Random) -> float | None:
    """The wait before trying again after ``error`` ended attempt ``attempt``; None: give up."""
    if not retryable(error) or not policy.retries_after(attempt):
        return None
    delay = policy.delay_s(attempt, hint_s(error), rng)
    log.info("%s; retry %d/%d in %.2f s", error, attempt + 1, policy.attempts - 1, delay)
    return delay


async def retry_async(call: Callable[[], Awaitable[T]], policy: RetryPolicy, retryable: Callable[[Exception], bool],
                      *, hint_s: Callable[[Exception], float | None] = no_hint, sleep: Sleep = asyncio.sleep,
                      rng: random.Random = JITTER) -> T:
    """``await call()`` until it returns, retrying the errors ``retryable`` accepts (module doc);
    the last error is raised as it is."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as error:
            delay = _next_delay_s(policy, attempt, error, retryable, hint_s, rng)
            if delay is None:
                raise
        await sleep(delay)
        attempt += 1


def retry_sync(call: Callable[[], T], policy: RetryPolicy, retryable: Callable[[Exception], bool], *,
               hint_s: Callable[[Exception], float | None] = no_hint, sleep: Callable[[float], None] = time.sleep,
               rng: random.Random = JITTER) -> T:
    """``retry_async`` for blocking calls (the SDK's synchronous client)."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as error:
            delay = _next_delay_s(policy, attempt, error, retryable, hint_s, rng)
            if delay is None:
                raise
        sleep(delay)
        attempt += 1
