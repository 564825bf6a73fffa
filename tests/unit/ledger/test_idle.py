"""Idle energy on the tenants' bills (scheduler.ledger.idle, scheduler.region.idle_windows): a
pool's idle joules of a billing window are shared by the joules each tenant was billed there,
priced at the last usable intensity the gateway saw, at the upper bound before; a window nobody
used is the operator's; the lines are ledger entries that count no request."""

from __future__ import annotations

import pytest

from scheduler.ledger.idle import RULE, UNATTRIBUTED, IdleWindow
from scheduler.region.idle_windows import IdleWindows
from scheduler.signal_check import UPPER_BOUND_G_PER_KWH
from scheduler.units import J_PER_KWH


def window(used: dict[str, float], idle_j: float = 900.0, carbon_g: float = 0.09) -> IdleWindow:
    return IdleWindow(region="eu-north", pool="h200-long", gateway="g1", window_start=7200.0, window_s=3600.0,
                      idle_j=idle_j, carbon_g=carbon_g, bounded_j=0.0, used_j=used)


def test_idle_energy_is_shared_by_use_and_adds_up() -> None:
    shares = window({"acme": 300.0, "globex": 100.0, "idle-tenant": 0.0}).shares()
    assert shares == {"acme": pytest.approx((675.0, 0.0675)), "globex": pytest.approx((225.0, 0.0225))}
    assert sum(j for j, _ in shares.values()) == pytest.approx(900.0)


def test_a_window_nobody_used_is_the_operators() -> None:
    assert window({}).shares() == {UNATTRIBUTED: (900.0, 0.09)}


def test_the_lines_are_entries_of_their_own_that_count_no_request() -> None:
    entries = window({"acme": 1.0, "glo:bex": 3.0}).entries()
    assert [e.tenant for e in entries] == ["acme", "glo:bex"]
    assert all(e.rule_version == RULE and e.requests == 0.0 and e.at == 10800.0 for e in entries)
    assert len({e.key for e in entries}) == 2
    assert all(e.key is not None and e.key.count(":") == 3 for e in entries)  # decision:region:pool
    assert {name: amount for _, name, amount in entries[0].writes()}["eu-north|idle|requests"] == 0.0


def test_a_record_round_trips_and_a_bad_one_is_refused_naming_the_field() -> None:
    record = window({"acme": 2.0})
    assert IdleWindow.from_claims(record.claims()) == record
    with pytest.raises(ValueError, match="idle_j must be a finite number"):
        IdleWindow.from_claims({**record.claims(), "idle_j": -1.0})
    with pytest.raises(ValueError, match="used_j must be an object"):
        IdleWindow.from_claims({**record.claims(), "used_j": [1]})


def test_the_gateway_prices_idle_joules_at_the_last_usable_intensity() -> None:
    windows = IdleWindows("eu-north", pue=1.2, window_s=3600.0, gateway="g1")
    windows.idle("h200-long", 3.6e6, now=100.0)  # no ticket seen yet: the upper bound
    windows.used("h200-long", "acme", 50.0, 30.0, now=200.0)
    windows.idle("h200-long", 3.6e6, now=300.0)  # at 30 g/kWh
    windows.used("h200-long", "globex", 150.0, float("nan"), now=400.0)  # not usable: the bound again
    windows.idle("h200-long", 1.8e6, now=500.0)
    windows.idle("a100-batch", 1.0, now=3700.0)  # the next window
    assert windows.closed(now=3599.0) == []
    [first] = windows.closed(now=3600.0)
    assert first.idle_j == pytest.approx(9.0e6) and first.bounded_j == pytest.approx(5.4e6)
    assert first.carbon_g == pytest.approx((UPPER_BOUND_G_PER_KWH * 1.5 + 30.0 * 1.0) * 1.2)
    assert first.used_j == {"acme": 50.0, "globex": 150.0} and first.window_start == 0.0
    [second] = windows.drain()
    assert (second.pool, second.window_start, second.idle_j) == ("a100-batch", 3600.0, 1.0)
    assert second.carbon_g == pytest.approx(1.0 / J_PER_KWH * UPPER_BOUND_G_PER_KWH * 1.2)
    assert windows.drain() == []
    # A window with uses and no idle joules (a gateway without a meter) is no record.
    windows.used("h200-long", "acme", 50.0, 30.0, now=8000.0)
    assert windows.closed(now=20000.0) == [] and windows.drain() == []
