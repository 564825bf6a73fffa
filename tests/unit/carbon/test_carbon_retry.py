"""Backoff and Retry-After arithmetic (the HTTP behaviour itself is tested against real
servers in tests/integration/carbon)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from scheduler.datalayer.carbon.http import RetryPolicy, retry_after_s


def test_backoff_is_full_jitter_within_the_exponential_cap():
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=4.0)
    rng = random.Random(1)
    for retry, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (6, 4.0)]:
        delays = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > 0.8 * cap  # spread over the range, not a constant


def test_backoff_is_reproducible_with_an_injected_rng():
    policy = RetryPolicy()
    first = [policy.backoff(n, random.Random(42)) for n in range(4)]
    again = [policy.backoff(n, random.Random(42)) for n in range(4)]
    assert first == again


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), (" 7 ", 7.0), (None, None), ("soon", None), ("-5", None)],
)
def test_retry_after_seconds(header, expected):
    assert retry_after_s(header, now=0.0) == expected


def test_retry_after_http_date():
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    header = format_datetime(datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert retry_after_s(header, now) == 30.0
    assert retry_after_s(header, now + 60) == 0.0  # in the past: go now
