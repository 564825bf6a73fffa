"""Attribution of a replica's metered energy among its requests: conservation under every
rule, and that each rule charges what it says it charges."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.energy.attribution import RULES, EnergyTrace, RequestTimeline, attribute
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.profile_model import ProfileEnergyModel

FLOOR_W = 75.0
COEFFICIENTS = ProfileEnergyModel().coefficients(
    MODEL_CATALOGUE["llama-3.1-8b"], GPU_CATALOGUE["H100-80GB"], "bf16", 1, 8)


def recorded_power_trace() -> EnergyTrace:
    """A 20 s power trace at 10 Hz: idle at the floor, busy bursts up to ~500 W, idle gaps."""
    rng = random.Random(11)
    samples = []
    for k in range(201):
        t = k * 0.1
        busy = 2.0 <= t < 9.0 or 11.0 <= t < 17.5
        samples.append((t, (420.0 + 80 * math.sin(t) + rng.uniform(-20, 20)) if busy else 74.0 + rng.uniform(-2, 2)))
    return EnergyTrace.from_power(samples)


def request_timeline() -> list[RequestTimeline]:
    return [
        RequestTimeline("short", 2.0, 2.0, 2.1, 4.0, prompt_tokens=200, cached_tokens=0, output_tokens=150),
        RequestTimeline("long-context", 2.5, 3.0, 3.6, 8.9, prompt_tokens=16000, cached_tokens=0, output_tokens=400),
        RequestTimeline("cached", 3.0, 3.0, 3.05, 6.0, prompt_tokens=4000, cached_tokens=3500, output_tokens=200),
        RequestTimeline("queued", 4.0, 6.0, 6.2, 8.0, prompt_tokens=300, cached_tokens=0, output_tokens=120),
        RequestTimeline("second-burst", 11.0, 11.0, 11.3, 17.4, prompt_tokens=1000, cached_tokens=0,
                        output_tokens=700),
        # Instantaneous prefill and a request that spans the idle gap.
        RequestTimeline("instant", 12.0, 12.0, 12.0, 12.5, prompt_tokens=10, cached_tokens=0, output_tokens=5),
        RequestTimeline("spans-gap", 8.5, 8.5, 8.7, 11.5, prompt_tokens=500, cached_tokens=0, output_tokens=300),
    ]


@pytest.mark.parametrize("version", sorted(RULES))
def test_joules_given_out_add_up_to_the_metered_total(version: str) -> None:
    trace, requests = recorded_power_trace(), request_timeline()
    result = attribute(trace, requests, RULES[version], floor_w=FLOOR_W, coefficients=COEFFICIENTS)
    shares = result.requests
    print(f"\n{version}: metered {result.metered_j:.1f} J, attributed {result.attributed_j:.1f} J, "
          f"unattributed {result.unattributed_j:.1f} J\n" + "\n".join(
              f"  {r.request_id:13s} {r.energy_j:8.1f} J (wait {r.waiting_j:6.1f}, prefill {r.prefill_j:6.1f}, "
              f"decode {r.decode_j:7.1f}, idle {r.idle_allocation_j:6.1f}; batch {r.batch_size:.2f})"
              for r in shares.values()))
    assert result.attributed_j + result.unattributed_j == pytest.approx(result.metered_j, rel=1e-12)
    assert result.unattributed_j == 0.0  # every idle joule went to a request of the window
    for r in shares.values():
        assert r.energy_j == pytest.approx(r.waiting_j + r.prefill_j + r.decode_j + r.idle_allocation_j)
        assert min(r.waiting_j, r.prefill_j, r.decode_j, r.idle_allocation_j) >= 0.0
        assert r.attribution_method == version
    assert shares["queued"].waiting_j > 0 and shares["short"].waiting_j == 0
    assert shares["cached"].avoided_j == pytest.approx(COEFFICIENTS.avoided_j(4000, 3500))
    assert shares["cached"].avoided_j > 3500 * COEFFICIENTS.prefill_j_per_token  # attention pairs too


@pytest.mark.parametrize("version", sorted(RULES))
def test_conservation_holds_for_random_traces(version: str) -> None:
    rng = random.Random(version)
    for _ in range(50):
        times = sorted({round(rng.uniform(0, 30), 3) for _ in range(rng.randint(2, 40))} | {0.0, 30.0})
        readings, total = [], rng.uniform(0, 1e6)
        for t in times:
            readings.append((t, total))
            total += rng.uniform(0, 800) * rng.random()
        requests = []
        for k in range(rng.randint(0, 12)):
            a = rng.uniform(-5, 32)
            s = a + rng.expovariate(1.0) * rng.choice([0, 1])
            f = s + rng.expovariate(2.0) * rng.choice([0, 1])
            requests.append(RequestTimeline(f"r{k}", a, s, f, f + rng.expovariate(0.3), rng.randint(0, 5000),
                                            rng.randint(0, 100), rng.randint(0, 900)))
        result = attribute(EnergyTrace.from_counter(readings), requests, RULES[version], floor_w=rng.uniform(0, 200),
                           coefficients=COEFFICIENTS if rng.random() < 0.5 else None)
        assert result.attributed_j + result.unattributed_j == pytest.approx(result.metered_j, rel=1e-9, abs=1e-6)
        assert all(r.energy_j >= 0 for r in result.requests.values())


def test_no_request_leaves_everything_unattributed() -> None:
    trace = EnergyTrace.from_counter([(0.0, 100.0), (1.0, 175.0), (2.0, 250.0)])
    result = attribute(trace, [], RULES["shared-v1"], floor_w=FLOOR_W)
    assert result.unattributed_j == pytest.approx(150.0) and result.requests == {}


def test_counter_going_backwards_is_not_a_negative_bill() -> None:
    trace = EnergyTrace.from_counter([(0.0, 1000.0), (1.0, 1500.0), (2.0, 10.0), (3.0, 410.0)])
    assert trace.total_j == pytest.approx(900.0)


def test_rules_charge_what_they_say() -> None:
    """Two requests in flight together for the same time, one with 10x the prompt: by time
    they pay the same; by tokens the long one pays more; by marginal cost more again in decode."""
    trace = EnergyTrace.from_power([(0.0, 400.0), (10.0, 400.0)])
    requests = [
        RequestTimeline("small", 0.0, 0.0, 1.0, 10.0, prompt_tokens=1000, cached_tokens=0, output_tokens=500),
        RequestTimeline("large", 0.0, 0.0, 1.0, 10.0, prompt_tokens=10000, cached_tokens=0, output_tokens=500),
    ]
    shares = {v: attribute(trace, requests, RULES[v], floor_w=FLOOR_W, coefficients=COEFFICIENTS).requests
              for v in RULES}
    print("\n" + "\n".join(f"{v}: small {s['small'].energy_j:.0f} J, large {s['large'].energy_j:.0f} J"
                           for v, s in shares.items()))
    assert shares["equal-v1"]["small"].energy_j == pytest.approx(shares["equal-v1"]["large"].energy_j)
    assert shares["shared-v1"]["large"].energy_j > shares["shared-v1"]["small"].energy_j
    assert shares["shared-v1"]["large"].decode_j == pytest.approx(shares["shared-v1"]["small"].decode_j)
    assert shares["marginal-v1"]["large"].decode_j > shares["marginal-v1"]["small"].decode_j
    assert shares["shared-v1"]["small"].batch_size == pytest.approx(2.0)


def test_timeline_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError, match="out of order"):
        RequestTimeline("x", 5.0, 4.0, 6.0, 7.0, 1, 0, 1)
