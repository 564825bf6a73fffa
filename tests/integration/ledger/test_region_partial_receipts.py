"""The region bills every dispatch with a ticket from its engine's own counts, however it ends.

Real: the region gateway (``RegionGateway``, the class Ray Serve runs: tickets, relay,
receipts, outbox) served over HTTP by uvicorn on port 0, the shared Redis (a namespace per
test), an HTTP client that aborts where told. Simulated: the pools' vLLM engines (stub
engines of ``tests.region_host`` that count the prompt tokens they prefill and the tokens they
hand over), and, for the client that leaves during the prefill, Ray Serve's proxy: the test
cancels the gateway's call itself, as Serve does when its client disconnects.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from scheduler.signed_region_receipt import STREAM, verify_receipt
from scheduler.state.factory import open_store
from scheduler.state.store import StateStore
from scheduler.tickets import HEADER as TICKET_HEADER
from scheduler.tickets import RegionKeys, Ticket, body_digest, sign
from tests.integration.ledger.conftest import SHARED_REDIS
from tests.region_host import EngineTally, InProcessRegion, StubEngine, read_tallies, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REGION = "eu-north"
POOL = "h200-long"
MODEL = "llama-3.1-8b"
KEYS = RegionKeys.generate(REGION, kid="k1")


@dataclass
class Region:
    host: InProcessRegion
    engines: dict[str, StubEngine]
    tally: Path
    store: StateStore

    def engine_counts(self, tag: str) -> tuple[int, int]:
        return read_tallies([self.tally])[(REGION, POOL, tag)]

    async def receipt(self, decision_id: str) -> dict[str, Any]:
        """The region's signed receipt of ``decision_id`` once it is in the store (verified)."""
        for _ in range(200):
            for _, entry in await self.store.xrange(STREAM, 1000):
                claims = verify_receipt(KEYS, entry)
                if claims["decision_id"] == decision_id:
                    return claims
            await asyncio.sleep(0.05)
        raise AssertionError(f"no receipt of decision {decision_id} reached the store")


@pytest.fixture
async def region(namespace: str, tmp_path: Path) -> AsyncIterator[Region]:
    from scheduler.config.loader import load_fleet

    config = next(r for r in load_fleet().regions if r.name == REGION)
    tally = tmp_path / "tally.jsonl"
    engines = {p.name: StubEngine(p.name, EngineTally(REGION, tally), prefill_s=0.3, token_interval_s=0.05)
               for p in config.pools}
    gateway = await start_gateway(REGION, engines, SHARED_REDIS, namespace, ticket_keys=KEYS)
    store = open_store(SHARED_REDIS, namespace)
    try:
        async with InProcessRegion(gateway) as host:
            yield Region(host, engines, tally, store)
    finally:
        await store.close()


def request(tag: str, max_tokens: int = 8, mode: str = "direct") -> tuple[dict[str, Any], dict[str, str], str]:
    """(body, headers with a ticket as the router signs it, decision id). The prompt is 300
    bytes: the engine counts 100 + tokens, a router's estimate 75 + 1."""
    body = {"model": MODEL, "prompt": f"[rid={tag}] " + "w" * (299 - len(tag) - 7), "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "x_scheduler": {"pool": POOL}}
    digest = body_digest(body)
    assert digest is not None
    decision_id = uuid.uuid4().hex
    ticket = Ticket(decision_id=decision_id, request_id=tag, tenant="acme", region=REGION, pool=POOL, model=MODEL,
                    max_tokens=max_tokens, prompt_tokens_max=4096, body_sha256=digest[0],
                    expires_at=time.time() + 30, mode=mode)  # type: ignore[arg-type]
    return body, {TICKET_HEADER: sign(KEYS, "ticket", asdict(ticket))}, decision_id


async def stream(region: Region, body: dict[str, Any], headers: dict[str, str],
                 abort_after: int | None = None) -> list[dict[str, Any]]:
    """The events a client reads; it hangs up after ``abort_after`` content events."""
    events: list[dict[str, Any]] = []
    url = f"{region.host.endpoint}/v1/completions"
    async with httpx.AsyncClient(timeout=10) as client, client.stream("POST", url, json=body,
                                                                      headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            events.append(json.loads(line[6:]))
            if abort_after is not None and sum(1 for e in events if e.get("choices")) >= abort_after:
                break
    return events


@pytest.mark.parametrize("mode", ["direct", "proxy"])
async def test_a_complete_stream_is_billed_by_the_region_in_either_mode(region: Region, mode: str) -> None:
    body, headers, decision_id = request(f"complete-{mode}", mode=mode)
    events = await stream(region, body, headers)
    claims = await region.receipt(decision_id)
    prompt, generated = region.engine_counts(f"complete-{mode}")
    assert (prompt, generated) == (100, 8)
    assert claims["usage"]["prompt_tokens"] == 100 and claims["usage"]["completion_tokens"] == 8
    assert claims["end_reason"] == "complete" and not claims["partial"] and not claims["tokens_estimated"]
    # The client's events carry no running usage (the gateway keeps it), and only a direct-mode
    # client gets the receipt in the final event (in proxy mode the router makes its own).
    assert all(e["usage"] is None for e in events if e.get("choices"))
    assert ("receipt" in events[-1]) is (mode == "direct")


@pytest.mark.parametrize("k", [1, 3])
async def test_a_client_that_aborts_at_token_k_is_billed_what_the_engine_did(region: Region, k: int) -> None:
    tag = f"abort-{k}"
    body, headers, decision_id = request(tag, max_tokens=30)
    events = await stream(region, body, headers, abort_after=k)
    claims = await region.receipt(decision_id)
    prompt, generated = region.engine_counts(tag)
    print(f"\nabort at token {k}: engine prefilled {prompt}, generated {generated}; receipt {claims['usage']}")
    assert sum(1 for e in events if e.get("choices")) == k and k <= generated < 30
    assert claims["partial"] and claims["end_reason"] == "cancelled" and not claims["tokens_estimated"]
    assert claims["usage"]["prompt_tokens"] == prompt == 100
    assert claims["usage"]["completion_tokens"] >= generated
    assert claims["energy"]["energy_j"] > 0
    assert all(engine.running == 0 for engine in region.engines.values())


def http_request(body: dict[str, Any], headers: dict[str, str]) -> Request:
    """The request as Serve's proxy hands it to the gateway."""
    raw = json.dumps(body).encode()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the client says nothing more
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "", "query_string": b"",
             "headers": [(name.encode(), value.encode()) for name, value in
                         {**headers, "content-type": "application/json"}.items()]}
    return Request(scope, receive)


@pytest.mark.parametrize("engine_counts", [True, False], ids=["engine-counts", "engine-gone"])
async def test_a_client_gone_during_the_prefill_is_billed_the_prompt(region: Region, engine_counts: bool) -> None:
    """Serve cancels the gateway's call when its client disconnects; here the prefill takes 0.3 s
    and the call is cancelled after 0.1 s. The prompt is billed at the engine's count; an engine
    that cannot count it any more is billed a lower bound from the prompt's bytes, marked so."""
    region.engines[POOL].count_fails = not engine_counts
    tag = f"prefill-{engine_counts}"
    body, headers, decision_id = request(tag)
    call = asyncio.create_task(region.host.gateway(http_request(body, headers)))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    claims = await region.receipt(decision_id)
    prompt, generated = region.engine_counts(tag)
    assert (prompt, generated) == (100, 0)
    assert claims["partial"] and claims["end_reason"] == "cancelled"
    assert claims["usage"]["completion_tokens"] == 0
    if engine_counts:
        assert claims["usage"]["prompt_tokens"] == 100 and not claims["tokens_estimated"]
    else:
        assert claims["usage"]["prompt_tokens"] == 3 and claims["tokens_estimated"]  # ceil(300 / 128)
    assert claims["energy"]["phases"]["prefill_j"] > 0
    assert region.host.gateway._flight.count(POOL) == 0


async def test_an_engine_that_dies_mid_stream_is_billed_as_a_region_error(region: Region) -> None:
    region.engines[POOL].fail_after = 2
    body, headers, decision_id = request("dies")
    with pytest.raises(httpx.RemoteProtocolError):
        await stream(region, body, headers)
    claims = await region.receipt(decision_id)
    assert claims["partial"] and claims["end_reason"] == "region-error"
    assert (claims["usage"]["prompt_tokens"], claims["usage"]["completion_tokens"]) == region.engine_counts("dies")


async def test_a_client_gone_before_the_answer_started_is_billed(region: Region) -> None:
    """The client hangs up during the prefill; the server notices only once the gateway has
    the engine's first token and hands it a response, and may cancel that response before it
    reads a byte of it. The stream is billed all the same: the prompt and that token."""
    body, headers, decision_id = request("gone-early")

    async def call() -> None:
        async with httpx.AsyncClient(timeout=10) as client, client.stream(
                "POST", f"{region.host.endpoint}/v1/completions", json=body, headers=headers) as response:
            await response.aread()

    caller = asyncio.create_task(call())
    # Hang up once the engine has the request, during its 0.3 s prefill (a fixed sleep cancelled
    # some calls before they reached the gateway on a loaded host: nothing to bill then).
    for _ in range(500):
        if (REGION, POOL, "gone-early") in read_tallies([region.tally]):
            break
        await asyncio.sleep(0.01)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    claims = await region.receipt(decision_id)
    assert claims["partial"] and claims["end_reason"] == "cancelled"
    assert (claims["usage"]["prompt_tokens"], claims["usage"]["completion_tokens"]) == region.engine_counts("gone-early")
    for _ in range(100):
        if region.host.gateway._flight.count(POOL) == 0:
            break
        await asyncio.sleep(0.02)
    assert region.host.gateway._flight.count(POOL) == 0
