"""Rendezvous homes of prefix keys (scheduler.region.prefix_router): spread over the replicas,
and a replica that leaves moves only the keys it was home to."""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler.region.prefix_router import home_of

pytestmark = pytest.mark.timeout(30)

KEYS = [f"auto:{i:024x}" for i in range(2000)]


def test_homes_spread_and_move_only_with_their_replica() -> None:
    four = ["r-a", "r-b", "r-c", "r-d"]
    homes = {key: home_of(key, four) for key in KEYS}
    counts = Counter(homes.values())
    assert set(counts) == set(four) and min(counts.values()) > 400  # 500 each on average
    three = [r for r in four if r != "r-c"]
    moved = [key for key in KEYS if home_of(key, three) != homes[key]]
    assert moved and all(homes[key] == "r-c" for key in moved)
    assert home_of(KEYS[0], list(reversed(four))) == homes[KEYS[0]]  # order of the list does not matter
