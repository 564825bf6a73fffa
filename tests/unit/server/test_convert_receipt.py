"""Request validation (every bad field named) and the receipt (measured vs modelled energy,
carbon from a fresh signal or else at a marked upper bound, partial receipts)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import errors
from scheduler.client.common import build_request
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.embodied import EMBODIED_CATALOGUE
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.server import convert
from scheduler.server.receipt_builder import ReceiptInputs, build_receipt
from scheduler.signal_check import UPPER_BOUND_G_PER_KWH
from scheduler.types import FleetSnapshot, Signal

NOW = 1_780_000_000.0


def snapshot(carbon_age_s: float | None = None) -> FleetSnapshot:
    fleet = load_fleet()
    carbon = {}
    if carbon_age_s is not None:
        carbon = {r.grid_zone: Signal("carbon_intensity", r.grid_zone, 100.0, "gCO2eq/kWh", NOW - carbon_age_s,
                                      NOW, "test") for r in fleet.regions}
    return SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default"))).build(NOW, carbon=carbon)


@pytest.mark.parametrize("options, fields", [
    ({"model": "gpt-9"}, {"model"}),
    ({"max_tokens": 0}, {"sampling.max_tokens"}),
    ({"temperature": -1.0, "top_p": 0.0}, {"sampling.temperature", "sampling.top_p"}),
    ({"prompt": None}, {"input"}),
    ({"prompt": None, "messages": []}, {"chat.messages"}),
    ({"prompt": None, "messages": [{"role": "robot", "content": "x"}]}, {"chat.messages[0].role"}),
    ({"jurisdictions": ["eu"]}, {"compliance.allowed_jurisdictions[0]"}),
    ({"client_location": (95.0, 0.0)}, {"client_location"}),
    ({"ttft_ms": -5.0}, {"slo.ttft_ms"}),
    ({"prompt_tokens": 10, "cached_tokens": 11}, {"cached_tokens"}),
], ids=lambda v: str(v))
def test_invalid_requests_name_each_field(options: dict[str, Any], fields: set[str]) -> None:
    kwargs = {"model": "llama-3.1-8b", "max_tokens": 8, "prompt": "hello", **options}
    with pytest.raises(errors.InvalidRequest) as caught:
        convert.incoming(build_request(**kwargs), "acme", snapshot())
    assert {v.field for v in caught.value.violations} == fields


def test_valid_request_converts() -> None:
    incoming = convert.incoming(build_request(
        model="llama-3.1-8b", max_tokens=8, prompt="x" * 400, jurisdictions=["EU"], workload_class="batch",
        client_location=(59.9, 10.7), temperature=0.0), "acme", snapshot())
    request = incoming.request
    assert request.prompt_tokens == 100 and incoming.prompt_tokens_estimated
    assert request.allowed_jurisdictions == frozenset({"EU"}) and request.workload_class == "batch"
    assert request.tenant == "acme" and request.client_location is not None
    assert incoming.call.path == "/v1/completions"
    assert incoming.call.body == {"prompt": "x" * 400, "max_tokens": 8, "temperature": 0.0}


def _inputs(snap: FleetSnapshot, energy: dict[str, Any] | None) -> ReceiptInputs:
    candidate = snap.candidates_by_model["llama-3.1-8b"][0]
    usage = {"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 100}}
    return ReceiptInputs("d1", "r1", "acme", candidate, snap, (), (), 100, usage, energy, 12.0, 80.0)


def test_receipt_from_the_model_when_the_region_measures_nothing() -> None:
    snap = snapshot(carbon_age_s=600)
    receipt = build_receipt(_inputs(snap, None))
    candidate = snap.candidates_by_model["llama-3.1-8b"][0]
    expected = snap.perf[candidate.index].energy.estimate(120, 100, 30)
    assert receipt.measurement_source == "model"
    assert receipt.energy_j == pytest.approx(expected.energy_j)
    assert receipt.prompt_tokens == 120 and receipt.reused_tokens == 100 and receipt.completion_tokens == 30
    assert receipt.avoided_j is not None and receipt.avoided_j > 0
    assert receipt.padding_ratio is None and receipt.confidence is None
    assert receipt.carbon_g == pytest.approx(expected.energy_j / 3.6e6 * 100.0 * candidate.region.pue)


def test_measured_energy_wins_and_stale_carbon_is_booked_at_the_upper_bound() -> None:
    snap = snapshot(carbon_age_s=3 * 3600)  # past the 2 h limit
    measured = {"energy_j": 42.0, "energy_j_low": 40.0, "energy_j_high": 44.0, "measurement_source": "nvml",
                "confidence": 0.9, "attribution_method": "shared-v1", "phases": {"decode_j": 30.0},
                "batch_size": 7.5}
    receipt = build_receipt(_inputs(snap, measured))
    assert (receipt.energy_j, receipt.measurement_source, receipt.confidence) == (42.0, "nvml", 0.9)
    assert receipt.decode_j == 30.0 and receipt.prefill_j is None and receipt.batch_size == 7.5
    # A stale signal is shown, never used as fresh: the grams are a conservative bound, marked so.
    assert receipt.carbon is not None and receipt.carbon.stale
    pue = snap.candidates_by_model["llama-3.1-8b"][0].region.pue
    assert receipt.carbon_g == pytest.approx(42.0 / 3.6e6 * UPPER_BOUND_G_PER_KWH * pue)
    assert receipt.carbon_basis == "upper-bound" and receipt.carbon_intensity_g_per_kwh == UPPER_BOUND_G_PER_KWH
    message = convert.receipt_to_proto(receipt)
    assert message.HasField("energy_j") and not message.HasField("prefill_j") and message.HasField("carbon_g")
    assert message.carbon_basis == "upper-bound" and not message.partial and message.end_reason == "complete"
    assert message.carbon_signal.stale


def _signal_snapshot(value: float, age_s: float) -> FleetSnapshot:
    fleet = load_fleet()
    carbon = {r.grid_zone: Signal("carbon_intensity", r.grid_zone, value, "gCO2eq/kWh", NOW - age_s, NOW, "test")
              for r in fleet.regions}
    return SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default"))).build(NOW, carbon=carbon)


@pytest.mark.parametrize("snap, intensity, basis", [
    (snapshot(), UPPER_BOUND_G_PER_KWH, "upper-bound"),  # no signal at all
    (_signal_snapshot(1500.0, 3 * 3600), 1500.0, "upper-bound"),  # stale, dirtier than the bound
    (_signal_snapshot(float("nan"), 60), UPPER_BOUND_G_PER_KWH, "upper-bound"),  # unusable value
    (_signal_snapshot(100.0, -3600), UPPER_BOUND_G_PER_KWH, "upper-bound"),  # dated an hour ahead
    (_signal_snapshot(100.0, 60), 100.0, "signal"),
], ids=["missing", "stale-above-bound", "nan", "future", "fresh"])
def test_carbon_is_never_booked_as_zero(snap: FleetSnapshot, intensity: float, basis: str) -> None:
    receipt = build_receipt(_inputs(snap, {"energy_j": 36.0, "measurement_source": "nvml"}))
    pue = snap.candidates_by_model["llama-3.1-8b"][0].region.pue
    assert receipt.carbon_basis == basis and receipt.carbon_intensity_g_per_kwh == intensity
    assert receipt.carbon_g == pytest.approx(36.0 / 3.6e6 * intensity * pue)


def test_a_partial_receipt_bills_the_relayed_events_when_the_region_sent_no_usage() -> None:
    snap = snapshot(carbon_age_s=60)
    candidate = snap.candidates_by_model["llama-3.1-8b"][0]
    inputs = ReceiptInputs("d1", "r1", "acme", candidate, snap, (), (), 100, None, None, 12.0, 80.0,
                           relayed_events=7, end_reason="cancelled")
    receipt = build_receipt(inputs)
    expected = snap.perf[candidate.index].energy.estimate(100, 0, 7)
    assert receipt.partial and receipt.end_reason == "cancelled" and receipt.completion_tokens == 7
    assert receipt.prompt_tokens == 100 and receipt.tokens_estimated
    assert receipt.measurement_source == "model" and receipt.energy_j == pytest.approx(expected.energy_j)
    message = convert.receipt_to_proto(receipt)
    assert message.partial and message.end_reason == "cancelled" and message.completion_tokens == 7
    # With the region's usage the counts are the engine's, not the router's.
    assert not build_receipt(_inputs(snap, None)).tokens_estimated


def test_the_receipt_says_what_its_carbon_figure_is_and_its_embodied_line() -> None:
    fleet = load_fleet()
    carbon = {r.grid_zone: Signal("carbon_intensity", r.grid_zone, 100.0, "gCO2eq/kWh", NOW - 600, NOW,
                                  "electricitymaps:/v3/carbon-intensity/latest", is_estimated=True,
                                  estimation_method="TIME_SLICER_AVERAGE", signal_type="average",
                                  emission_factors="lifecycle") for r in fleet.regions}
    snap = SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default"))).build(NOW, carbon=carbon)
    receipt = build_receipt(_inputs(snap, None))
    message = convert.receipt_to_proto(receipt).carbon_signal
    assert (message.signal_type, message.emission_factors, message.estimated, message.estimation_method) == (
        "average", "lifecycle", True, "TIME_SLICER_AVERAGE")
    # Embodied carbon: the GPU's catalogue entry, 80 ms of its GPUs shared with the predicted
    # batch; its own line, not in carbon_g under the default policy.
    candidate = snap.candidates_by_model["llama-3.1-8b"][0]
    entry = EMBODIED_CATALOGUE[candidate.gpu.name]
    batch = snap.perf[candidate.index].batch
    assert receipt.embodied_g == pytest.approx(entry.grams(candidate.deployment.tensor_parallel, 0.080, batch))
    assert candidate.gpu.name in receipt.embodied_basis and entry.method in receipt.embodied_basis
    operational = receipt.energy_j / 3.6e6 * 100.0 * candidate.region.pue  # type: ignore[operator]
    assert receipt.carbon_g == pytest.approx(operational)
    assert convert.receipt_to_proto(receipt).embodied_g == pytest.approx(receipt.embodied_g)
    # A policy that counts it adds it to carbon_g.
    counting = fleet.policy("default").model_copy(update={"embodied_in_carbon": True})
    snap = SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(counting)).build(NOW, carbon=carbon)
    with_embodied = build_receipt(_inputs(snap, None))
    assert with_embodied.carbon_g == pytest.approx(operational + receipt.embodied_g)


def test_embodied_catalogue_covers_every_gpu_and_amortises_over_its_lifetime() -> None:
    assert set(EMBODIED_CATALOGUE) == set(GPU_CATALOGUE)
    a100 = EMBODIED_CATALOGUE["A100-40GB"]
    assert a100.method == "cited" and a100.kg_co2e == 318.0
    # 318 kg over 5 years: 2.0 mg per GPU-second; a request alone on 2 GPUs for 10 s: 40 mg.
    assert a100.g_per_gpu_second == pytest.approx(318_000 / (5 * 365.25 * 86400))
    assert a100.grams(2, 10.0, 1.0) == pytest.approx(20 * a100.g_per_gpu_second)
    assert a100.grams(2, 10.0, 4.0) == pytest.approx(5 * a100.g_per_gpu_second)



def test_the_prompt_a_partial_receipt_bills_is_the_routers_count_never_the_clients() -> None:
    """A client that declares a short, fully cached prompt does not make its prefill cheap: the
    router's own count (from the prompt's 400 bytes) is what a receipt bills without usage."""
    declared = convert.incoming(build_request(model="llama-3.1-8b", max_tokens=8, prompt="x" * 400,
                                              prompt_tokens=4, cached_tokens=4), "acme", snapshot())
    honest = convert.incoming(build_request(model="llama-3.1-8b", max_tokens=8, prompt="x" * 400),
                              "acme", snapshot())
    assert declared.request.prompt_tokens == 4 and declared.request.cached_tokens == 4
    assert declared.counted_prompt_tokens == honest.counted_prompt_tokens == 100
    snap = snapshot(carbon_age_s=60)
    candidate = snap.candidates_by_model["llama-3.1-8b"][0]
    receipt = build_receipt(ReceiptInputs("d1", "r1", "acme", candidate, snap, (), (),
                                          declared.counted_prompt_tokens, None, None, 12.0, 80.0,
                                          relayed_events=0, end_reason="cancelled"))
    expected = snap.perf[candidate.index].energy.estimate(100, 0, 0)
    assert receipt.prompt_tokens == 100 and receipt.energy_j == pytest.approx(expected.energy_j)
