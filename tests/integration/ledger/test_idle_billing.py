"""Idle energy reaches the tenants' bills (issue 28.3), end to end on the shared Redis.

Real: the region's ``RegionGateway`` (without Ray) with tickets, its NVML meter (over the fake
library: NVML needs a GPU) splitting each GPU interval among the requests on it and counting
idle intervals per pool, its idle windows (1 s here) signed into the ``receipts`` stream with
its request receipts; the router's ``RegionReceiptIngest`` and ``LedgerService`` booking both
into the ledger on Redis. Simulated: the pool's engine (two replicas streaming as vLLM does).

The GPUs draw ``IDLE_W`` all the time and more while requests run. Tenants acme (two requests)
and globex (one) use the pool. Checked: every joule the GPUs drew is on a bill (the requests'
receipts plus the idle lines, tenants' and the operator's), each window's idle joules go to
the tenants in proportion to what they were billed in it, and no idle line counts a request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis

from scheduler.ledger.idle import RULE, UNATTRIBUTED
from scheduler.ledger.ledger import Ledger
from scheduler.ledger.service import LedgerService
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.gateway import GatewaySettings, PoolEngine, RegionGateway
from scheduler.server.region_receipt_ingest import RegionReceiptIngest
from scheduler.state.redis_store import RedisStore
from scheduler.tickets import COMPLETIONS, HEADER, MAX_TICKET_TTL_S, Ticket, TicketKeyRing, body_digest
from tests.integration.ledger.conftest import SHARED_REDIS
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml
from tests.unit.region.test_gateway_energy import POOL, WATTS, FakePool, FakeReplica, relayed_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

IDLE_W = 60.0
WINDOW_S = 1.0
TENANTS = ("acme", "acme", "globex")


def ticket_for(ring: TicketKeyRing, body: dict[str, Any], tenant: str) -> str:
    digest = body_digest(body)
    assert digest is not None
    return Ticket(decision_id=uuid.uuid4().hex, request_id="idle", tenant=tenant, region="eu-north", pool=POOL,
                  model=body["model"], max_tokens=body["max_tokens"], prompt_tokens_max=4096, body_sha256=digest[0],
                  expires_at=time.time() + MAX_TICKET_TTL_S, endpoint=COMPLETIONS, carbon_g_per_kwh=42.0,
                  carbon_zone="SE-SE3", carbon_observed_at=time.time(), carbon_source="test").sign(ring.of("eu-north"))


async def idle_draw(gpus: list[FakeGpu], stop: asyncio.Event) -> None:
    """What a warm GPU draws with nothing to run."""
    while not stop.is_set():
        await asyncio.sleep(0.01)
        for gpu in gpus:
            gpu.energy_mj += round(IDLE_W * 10)


def test_idle_energy_is_billed_to_the_tenants_that_used_the_pool(monkeypatch: pytest.MonkeyPatch,
                                                                 namespace: str) -> None:
    gpus = [FakeGpu(energy_mj=5_000_000, power_mw=int(WATTS * 1000)) for _ in range(2)]
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(gpus=gpus))
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: FakeNvml(library_found=False))
    region = next(r for r in load_checked_fleet().regions if r.name == "eu-north")
    ring = TicketKeyRing.generate(["eu-north"])
    replicas = [FakeReplica("LLMServer:h200-long#a", gpus[0], 0), FakeReplica("LLMServer:h200-long#b", gpus[1], 1)]
    pool = FakePool(replicas, route=[0, 1, 0])
    settings = GatewaySettings(region=region, pools={POOL: (PoolEngine("tiny-llama", 2048),)},
                               store_url=SHARED_REDIS, namespace=namespace, ticket_keys=ring.of("eu-north"),
                               meter_interval_s=0.2, idle_window_s=WINDOW_S, publish_interval_s=0.5)
    cls = RegionGateway.func_or_class  # type: ignore[attr-defined]
    start_mj = [gpu.energy_mj for gpu in gpus]

    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        stop = asyncio.Event()
        drawing = asyncio.create_task(idle_draw(gpus, stop))
        gateway = cls.__new__(cls)
        await gateway.__init__({POOL: {"tiny-llama": pool}}, settings)
        finals = []
        for tenant in TENANTS:
            finals.append(await relayed_request(gateway, 60, lambda body, t=tenant: {HEADER: ticket_for(ring, body, t)}))
            await asyncio.sleep(0.3)
        await asyncio.sleep(2 * WINDOW_S)
        stop.set()
        await drawing
        await asyncio.sleep(0.5)  # the meter closes the last intervals
        await gateway.__del__()  # the open windows and every receipt to the store

        class Stopped(cls):  # type: ignore[misc, valid-type]
            def __del__(self) -> None:  # torn down above
                pass

        gateway.__class__ = Stopped
        energy = gateway._flight  # the gateway's own accounts: idle joules per pool
        store = RedisStore.from_url(SHARED_REDIS, namespace)
        ledger = LedgerService(Ledger(store))
        idle_records = []

        def book_idle(window: Any) -> None:
            idle_records.append(window)
            ledger.sink_idle(window)

        ingest = RegionReceiptIngest(store, ring, ledger.sink, ledger.write, book_idle=book_idle)
        while await ingest.ingest_once():
            pass
        assert ingest.rejected == 0
        await ledger.write()
        await store.close()
        return {"idle_j": dict(energy.idle_j), "attributed_j": energy.attributed_j}, \
            [{"final": f, "records": idle_records} for f in finals]

    accounts, results = asyncio.run(run())
    records = results[0]["records"]
    client = redis.Redis.from_url(SHARED_REDIS, decode_responses=True)
    try:
        month = time.strftime("%Y-%m", time.gmtime())
        books = {tenant: client.hgetall(f"sched:{namespace}:ledger:{tenant}:{month}")
                 for tenant in ("acme", "globex", UNATTRIBUTED)}
    finally:
        client.close()
    drawn_j = sum(gpu.energy_mj - start for gpu, start in zip(gpus, start_mj, strict=True)) / 1000
    billed_j = sum(r["final"]["energy"]["energy_j"] for r in results)
    idle_lines = {tenant: float(fields.get(f"eu-north|{RULE}|energy_j", 0.0)) for tenant, fields in books.items()}
    print(f"\nGPUs drew {drawn_j:.1f} J: requests billed {billed_j:.1f} J, idle {sum(accounts['idle_j'].values()):.1f} J "
          f"({accounts['idle_j']}); idle lines {idle_lines}; {len(records)} idle records")

    # Every joule is on a bill: the requests' receipts plus the idle lines.
    assert billed_j + sum(idle_lines.values()) == pytest.approx(drawn_j, rel=1e-6)
    assert sum(idle_lines.values()) == pytest.approx(sum(accounts["idle_j"].values()), rel=1e-9)
    assert idle_lines["acme"] > 0 and idle_lines["globex"] > 0 and idle_lines[UNATTRIBUTED] > 0
    # Each window is shared by use; no idle line counts a request.
    for record in records:
        total = sum(record.used_j.values())
        for entry in record.entries():
            if entry.tenant != UNATTRIBUTED:
                assert entry.energy_j == pytest.approx(record.idle_j * record.used_j[entry.tenant] / total)
    for fields in books.values():
        assert float(fields.get(f"eu-north|{RULE}|requests", 0.0)) == 0.0
    assert float(books["acme"]["eu-north|predicted-share-v1|requests"]) == 2.0
