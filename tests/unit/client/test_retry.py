"""scheduler.wire.retry, the retry policy of the SDK and the data layer: equal-jitter backoff
under its cap, the server's hint honoured and capped, the attempt limit, no retry of what the
caller calls final; and the Retry-After arithmetic. The random source and the sleep are
injected: nothing here waits (the HTTP behaviour itself is tested against real servers in
tests/integration/carbon)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import grpc
import pytest
from google.rpc import error_details_pb2

from scheduler.client.common import retryable
from scheduler.client.errors import InvalidArgumentError, UnavailableError
from scheduler.wire.retry import RetryPolicy, retry_after_s, retry_async, retry_sync


class Flaky(Exception):
    """A failure that may pass; ``hint_s`` is the wait the server asked for."""

    def __init__(self, hint_s: float | None = None) -> None:
        super().__init__("flaky")
        self.hint_s = hint_s


class Final(Exception):
    """A failure retrying cannot mend."""


def is_flaky(error: Exception) -> bool:
    return isinstance(error, Flaky)


def flaky_hint(error: Exception) -> float | None:
    return error.hint_s if isinstance(error, Flaky) else None


class Calls:
    """A call that raises each of ``failures`` in turn, then returns "done"."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"

    async def once(self) -> str:
        return self()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)

    async def wait(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_backoff_is_equal_jitter_within_the_exponential_cap() -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=4.0)
    rng = random.Random(1)
    for retry, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (6, 4.0)]:
        delays = [policy.delay_s(retry, None, rng) for _ in range(200)]
        assert all(cap / 2 <= d <= cap for d in delays)  # never less than half: the attempts keep their span
        assert max(delays) > 0.9 * cap and min(delays) < 0.6 * cap  # spread over the range, not a constant


def test_backoff_is_reproducible_with_an_injected_rng() -> None:
    policy = RetryPolicy()
    first = [policy.delay_s(n, None, random.Random(42)) for n in range(4)]
    again = [policy.delay_s(n, None, random.Random(42)) for n in range(4)]
    assert first == again


def test_the_servers_hint_is_waited_exactly_up_to_the_cap() -> None:
    policy = RetryPolicy(max_backoff_s=0.5, max_hint_s=10.0)
    rng = random.Random(3)
    assert policy.delay_s(0, 7.5, rng) == 7.5  # longer than the backoff's cap: the server knows best
    assert policy.delay_s(0, 600.0, rng) == 10.0
    assert policy.delay_s(2, 0.0, rng) == 0.0
    assert policy.delay_s(0, -1.0, rng) == 0.0


async def test_a_call_is_tried_at_most_attempts_times_and_the_last_error_raised() -> None:
    calls, sleeps = Calls(Flaky(), Flaky(), Flaky(hint_s=1.5), Flaky()), Sleeps()
    with pytest.raises(Flaky) as caught:
        await retry_async(calls.once, RetryPolicy(attempts=3, initial_backoff_s=0.2, max_backoff_s=0.3), is_flaky,
                          hint_s=flaky_hint, sleep=sleeps.wait, rng=random.Random(5))
    assert calls.count == 3 and caught.value.hint_s == 1.5
    assert len(sleeps.calls) == 2 and 0.0 <= sleeps.calls[0] <= 0.2 and 0.0 <= sleeps.calls[1] <= 0.3


async def test_a_final_error_is_raised_at_once() -> None:
    calls, sleeps = Calls(Final()), Sleeps()
    with pytest.raises(Final):
        await retry_async(calls.once, RetryPolicy(attempts=5), is_flaky, sleep=sleeps.wait)
    assert calls.count == 1 and sleeps.calls == []


async def test_a_call_that_passes_returns_after_waiting_the_hints() -> None:
    calls, sleeps = Calls(Flaky(hint_s=1.0), Flaky(hint_s=90.0)), Sleeps()
    done = await retry_async(calls.once, RetryPolicy(attempts=3, max_hint_s=5.0), is_flaky, hint_s=flaky_hint,
                             sleep=sleeps.wait)
    assert done == "done" and sleeps.calls == [1.0, 5.0]


def test_the_blocking_twin_retries_alike() -> None:
    calls, sleeps = Calls(Flaky(), Flaky(hint_s=0.7)), Sleeps()
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.1, max_hint_s=1.0)
    assert retry_sync(calls, policy, is_flaky, hint_s=flaky_hint, sleep=sleeps, rng=random.Random(9)) == "done"
    assert calls.count == 3 and 0.0 <= sleeps.calls[0] <= 0.1 and sleeps.calls[1] == 0.7
    final = Calls(Final())
    with pytest.raises(Final):
        retry_sync(final, policy, is_flaky, sleep=sleeps)
    assert final.count == 1 and len(sleeps.calls) == 2


def test_the_sdk_retries_only_an_unavailable_router_that_says_it_may() -> None:
    refused = error_details_pb2.ErrorInfo(metadata={"retryable": "false"})
    assert retryable(UnavailableError(grpc.StatusCode.UNAVAILABLE, "no region answered"))
    assert not retryable(UnavailableError(grpc.StatusCode.UNAVAILABLE, "the stream broke mid-text", (refused,)))
    assert not retryable(InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"))


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), (" 7 ", 7.0), (None, None), ("soon", None), ("-5", None)],
)
def test_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header, now=0.0) == expected


def test_retry_after_http_date() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    header = format_datetime(datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert retry_after_s(header, now) == 30.0
    assert retry_after_s(header, now + 60) == 0.0  # in the past: go now
