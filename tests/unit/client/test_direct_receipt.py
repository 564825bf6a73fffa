"""Direct mode's receipt, made by the SDK alone (scheduler.wire): the region's claims, as they
arrive in the stream's final event, become the same EnergyReceipt message the router sends in
proxy mode, with the failovers that preceded the region that answered."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from scheduler.client import direct
from scheduler.signed_region_receipt import UPPER_BOUND_G_PER_KWH, receipt_claims
from scheduler.tickets import Ticket
from scheduler.v1 import messages_pb2 as pb

ENERGY = {"energy_j": 36.0, "energy_j_low": 30.0, "energy_j_high": 42.0, "measurement_source": "nvml",
          "confidence": 0.8, "attribution_method": "token-share", "phases": {"prefill_j": 6.0, "decode_j": 30.0}}


def ticket(g_per_kwh: float | None) -> Ticket:
    return Ticket(decision_id="d1", request_id="r1", tenant="acme", region="eu-north", pool="h200-long",
                  model="llama-3.1-8b", max_tokens=16, prompt_tokens_max=10, body_sha256="x", expires_at=0.0,
                  mode="direct", carbon_g_per_kwh=g_per_kwh, carbon_zone="NO", carbon_observed_at=1000.0,
                  carbon_source="csv")


@dataclass(frozen=True)
class Case:
    name: str
    g_per_kwh: float | None
    basis: str
    intensity: float
    zone: str  # the carbon signal's zone in the receipt ("": none)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", [
    Case("a usable signal prices the grams", 100.0, "signal", 100.0, "NO"),
    Case("no signal: an upper bound, no signal named", None, "upper-bound", UPPER_BOUND_G_PER_KWH, ""),
], ids=lambda c: c.name)
def test_the_regions_final_event_becomes_the_receipt(case: Case) -> None:
    claims = receipt_claims(ticket(case.g_per_kwh), pue=1.1, energy=ENERGY,
                            usage={"prompt_tokens": 10, "completion_tokens": 16, "cached_tokens": 4},
                            at=1010.0, ttft_ms=12.0, duration_ms=80.0, precision="fp8")
    final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "receipt": claims}
    stream = direct.DirectStream()
    text = stream.feed(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
    assert text == "" and stream.done
    earlier = pb.Failover(region="eu-central", pool="a100-chat", error="HTTP 503: busy", http_status=503)

    receipt = direct.receipt_proto(stream.receipt_claims, [earlier])

    assert receipt is not None
    assert (receipt.decision_id, receipt.region, receipt.pool, receipt.precision) == ("d1", "eu-north", "h200-long", "fp8")
    assert (receipt.energy_j, receipt.prefill_j, receipt.measurement_source) == (36.0, 6.0, "nvml")
    assert (receipt.prompt_tokens, receipt.completion_tokens, receipt.reused_tokens) == (10, 16, 4)
    assert receipt.carbon_basis == case.basis and receipt.carbon_intensity_g_per_kwh == case.intensity
    assert receipt.carbon_g == pytest.approx(36.0 / 3.6e6 * case.intensity * 1.1)
    assert receipt.carbon_signal.zone == case.zone
    if case.zone:
        assert (receipt.carbon_signal.value, receipt.carbon_signal.age_s) == (100.0, 10.0)
    assert list(receipt.failovers) == [earlier]
    assert not receipt.partial and receipt.end_reason == "complete"
    assert receipt.tickets_enforced  # a region that writes claims is a gateway, which checks tickets


@pytest.mark.timeout(10)
def test_a_region_that_sends_no_claims_gives_no_receipt() -> None:
    assert direct.receipt_proto(None, []) is None
