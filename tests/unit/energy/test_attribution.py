"""Attribution of a replica's metered energy among its requests: conservation under every
rule, and that each rule charges what it says it charges (the offline rules over a whole
trace, and the online rule "predicted-share-v1" interval by interval)."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.energy.attribution import RULES, EnergyTrace, RequestTimeline, Work, attribute, split_interval
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.profile_energy_model import ProfileEnergyModel

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


# --- the online rule, "predicted-share-v1" (split_interval) ----------------------------------


def work(prefill_j: float = 0.0, decode_j: float = 0.0, seconds: float = 0.2, ratio_error: float = 0.27,
         decoding: bool = True) -> Work:
    return Work(prefill_j=prefill_j, decode_j=decode_j, seconds=seconds, decoding=decoding, ratio_error=ratio_error)


def test_an_interval_is_split_in_proportion_to_the_predicted_energy_of_each_request_s_work() -> None:
    split = split_interval(90.0, {"twice": work(decode_j=2.0), "once": work(decode_j=1.0)})
    assert split.weighed_by == "predicted" and split.idle_j == 0.0
    assert split.shares["twice"].energy_j == pytest.approx(60.0) and split.shares["once"].energy_j == pytest.approx(30.0)
    assert split.shares["twice"].energy_j == pytest.approx(2 * split.shares["once"].energy_j)


def test_a_share_keeps_the_prefill_and_decode_parts_of_its_work() -> None:
    split = split_interval(100.0, {"first-token": work(prefill_j=3.0, decode_j=1.0), "decoding": work(decode_j=1.0)})
    first = split.shares["first-token"]
    assert first.prefill_j == pytest.approx(60.0) and first.decode_j == pytest.approx(20.0)
    assert split.shares["decoding"].prefill_j == 0.0


def test_an_interval_with_nothing_on_the_gpu_is_idle_and_nobody_s() -> None:
    split = split_interval(12.5, {})
    assert split.weighed_by == "idle" and split.idle_j == 12.5 and not split.shares and split.attributed_j == 0.0


def test_without_reported_work_the_interval_is_split_by_time_on_the_replica() -> None:
    split = split_interval(30.0, {"prefilling": work(seconds=0.2, decoding=False), "joined-late": work(seconds=0.1)})
    assert split.weighed_by == "time"
    assert split.shares["prefilling"].prefill_j == pytest.approx(20.0) and split.shares["prefilling"].decode_j == 0.0
    assert split.shares["joined-late"].decode_j == pytest.approx(10.0)
    both_instant = split_interval(8.0, {"a": work(seconds=0.0), "b": work(seconds=0.0)})
    assert both_instant.shares["a"].energy_j == both_instant.shares["b"].energy_j == pytest.approx(4.0)


def test_a_request_alone_on_its_gpu_gets_the_measurement_without_model_error() -> None:
    alone = split_interval(50.0, {"only": work(decode_j=7.0)}).shares["only"]
    assert alone.energy_j == 50.0 and alone.fraction == 1.0 and alone.model_error_j == 0.0
    shared = split_interval(50.0, {"a": work(decode_j=1.0, ratio_error=0.27), "b": work(decode_j=3.0)}).shares["a"]
    # share x ratio error x (1 - fraction): 12.5 J x 0.27 x 0.75
    assert shared.model_error_j == pytest.approx(12.5 * 0.27 * 0.75)


def test_every_interval_conserves_the_measured_joules() -> None:
    rng = random.Random(25)
    for _ in range(2000):
        requests = {f"r{k}": work(prefill_j=rng.choice([0.0, rng.uniform(0, 500)]),
                                  decode_j=rng.choice([0.0, rng.uniform(0, 50)]), seconds=rng.uniform(0, 0.2),
                                  decoding=rng.random() < 0.5)
                    for k in range(rng.randint(0, 80))}
        measured = rng.uniform(0, 200)
        split = split_interval(measured, requests)
        assert split.attributed_j + split.idle_j == pytest.approx(measured, rel=1e-12, abs=1e-12)
        assert all(s.energy_j >= 0 and s.model_error_j >= 0 for s in split.shares.values())
        assert set(split.shares) == set(requests)
