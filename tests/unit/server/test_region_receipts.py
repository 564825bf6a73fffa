"""Direct-mode receipts: a region signs them into the store's stream; one router books each
once, after checking the signature; forged ones are never booked."""

from __future__ import annotations

import asyncio

from scheduler.server.region_receipt_ingest import RegionReceiptIngest
from scheduler.signed_region_receipt import STREAM, STREAM_MAXLEN, receipt_claims, sign_receipt
from scheduler.state.memory_store import MemoryStore
from scheduler.tickets import RegionKeys, Ticket, TicketKeyRing
from scheduler.types import EnergyReceipt

RING = TicketKeyRing({name: RegionKeys.generate(name, kid=f"{name}-k1") for name in ("eu-north", "us-east")})
ENERGY = {"energy_j": 36.0, "energy_j_low": 30.0, "energy_j_high": 42.0, "measurement_source": "model",
          "confidence": 0.8, "attribution_method": "model-v1", "phases": {"prefill_j": 6.0, "decode_j": 30.0}}


def ticket(decision_id: str, region: str = "eu-north", g_per_kwh: float | None = 100.0) -> Ticket:
    return Ticket(decision_id=decision_id, request_id=f"r-{decision_id}", tenant="acme", region=region,
                  pool="h200-long", model="llama-3.1-8b", max_tokens=16, prompt_tokens_max=10, body_sha256="x",
                  expires_at=0.0, mode="direct", carbon_g_per_kwh=g_per_kwh, carbon_zone="NO",
                  carbon_observed_at=1000.0, carbon_source="csv")


def claims(decision_id: str, **options: object) -> dict[str, object]:
    return receipt_claims(ticket(decision_id, **options), pue=1.1, energy=ENERGY,  # type: ignore[arg-type]
                          usage={"prompt_tokens": 10, "completion_tokens": 16, "cached_tokens": 4},
                          at=1010.0, ttft_ms=12.0, duration_ms=80.0, precision="fp8")


def test_each_signed_receipt_is_booked_once_and_forgeries_never() -> None:
    async def scenario() -> tuple[list[EnergyReceipt], list[EnergyReceipt], RegionReceiptIngest]:
        store = MemoryStore()
        booked_a: list[EnergyReceipt] = []
        booked_b: list[EnergyReceipt] = []
        router_a = RegionReceiptIngest(store, RING, booked_a.append, owner="a")
        router_b = RegionReceiptIngest(store, RING, booked_b.append, owner="b")
        await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims("d1")), STREAM_MAXLEN)
        # A receipt signed with us-east's key but claiming eu-north, and one with a made-up key.
        forged = sign_receipt(RING.of("us-east"), claims("d2"))
        await store.xadd(STREAM, {**forged, "region": "eu-north"}, STREAM_MAXLEN)
        await store.xadd(STREAM, sign_receipt(RegionKeys.generate("eu-north", kid="eu-north-k1"), claims("d3")),
                         STREAM_MAXLEN)
        assert await router_a.ingest_once() == 3
        assert await router_b.ingest_once() == 0  # a holds the lock
        await store.xadd(STREAM, sign_receipt(RING.of("us-east"), claims("d4", region="us-east")), STREAM_MAXLEN)
        assert await router_a.ingest_once() == 1  # only what came after the cursor
        assert await router_a.ingest_once() == 0
        return booked_a, booked_b, router_a

    booked, other, ingest = asyncio.run(scenario())
    assert [r.decision_id for r in booked] == ["d1", "d4"] and other == []
    assert ingest.rejected == 2
    first = booked[0]
    assert (first.tenant, first.region, first.pool, first.model) == ("acme", "eu-north", "h200-long", "llama-3.1-8b")
    assert first.precision == "fp8"  # signed by the region, as its config serves the model there
    assert first.energy_j == 36.0 and first.prefill_j == 6.0 and first.reused_tokens == 4
    # 36 J = 1e-5 kWh, x 100 g/kWh x PUE 1.1
    assert first.carbon_g is not None and abs(first.carbon_g - 36.0 / 3.6e6 * 100.0 * 1.1) < 1e-12
    assert first.carbon is not None and first.carbon.signal.key == "NO" and first.carbon.age_s == 10.0


def test_without_a_usable_signal_the_grams_are_an_upper_bound_not_zero() -> None:
    from scheduler.signed_region_receipt import UPPER_BOUND_G_PER_KWH, RegionReceipt

    receipt = RegionReceipt(claims("d1", g_per_kwh=None)).energy_receipt()
    assert receipt.energy_j == 36.0 and receipt.carbon is None
    assert receipt.carbon_g is not None and abs(receipt.carbon_g - 36.0 / 3.6e6 * UPPER_BOUND_G_PER_KWH * 1.1) < 1e-12
    assert receipt.carbon_basis == "upper-bound" and receipt.carbon_intensity_g_per_kwh == UPPER_BOUND_G_PER_KWH
    fresh = RegionReceipt(claims("d2")).energy_receipt()
    assert fresh.carbon_basis == "signal" and fresh.carbon_intensity_g_per_kwh == 100.0
    # An intensity no grid can have (a unit mix-up: g/MWh) is not used either.
    assert claims("d3", g_per_kwh=100_000.0)["carbon_basis"] == "upper-bound"


def test_another_router_takes_over_when_the_holder_stops() -> None:
    clock = [0.0]

    async def scenario() -> list[str]:
        store = MemoryStore(clock=lambda: clock[0])
        booked: list[EnergyReceipt] = []
        holder = RegionReceiptIngest(store, RING, lambda r: None, owner="a", lock_ttl_s=5.0)
        standby = RegionReceiptIngest(store, RING, booked.append, owner="b", lock_ttl_s=5.0)
        await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims("d1")), STREAM_MAXLEN)
        assert await holder.ingest_once() == 1
        await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims("d2")), STREAM_MAXLEN)
        assert await standby.ingest_once() == 0
        clock[0] += 6.0  # the holder died: its lock expired
        assert await standby.ingest_once() == 1
        return [r.decision_id for r in booked]

    assert asyncio.run(scenario()) == ["d2"]


def test_the_cursor_moves_past_a_batch_only_once_it_is_written() -> None:
    """Booking queues a receipt; a holder that dies before its ledger and audit wrote the batch
    (a SIGKILL) has not moved the cursor, so the next holder books the batch again; a holder
    that lives moves it once they wrote it."""
    clock = [0.0]

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        store = MemoryStore(clock=lambda: clock[0])
        written = [False]

        async def is_written() -> bool:
            return written[0]

        queued: list[EnergyReceipt] = []
        booked: list[EnergyReceipt] = []
        holder = RegionReceiptIngest(store, RING, queued.append, is_written, owner="a", lock_ttl_s=5.0)
        standby = RegionReceiptIngest(store, RING, booked.append, is_written, owner="b", lock_ttl_s=5.0)
        for decision_id in ("d1", "d2"):
            await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims(decision_id)), STREAM_MAXLEN)
        assert await holder.ingest_once() == 2
        await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims("d3")), STREAM_MAXLEN)
        assert await holder.ingest_once() == 0  # nothing new is read while the batch is unwritten
        clock[0] += 6.0  # it died with d1 and d2 queued: its lock expired
        assert await standby.ingest_once() == 3
        written[0] = True
        await store.xadd(STREAM, sign_receipt(RING.of("eu-north"), claims("d4")), STREAM_MAXLEN)
        assert await standby.ingest_once() == 1  # the cursor moved past d1..d3 first
        return ([r.decision_id for r in queued], [r.decision_id for r in booked],
                [r.decision_id for r in booked[3:]])

    queued, booked, after = asyncio.run(scenario())
    assert queued == ["d1", "d2"] and booked == ["d1", "d2", "d3", "d4"] and after == ["d4"]
