"""The dispatch ticket's contract, against the real region gateway (issue 26.4).

Real: ``RegionGateway`` (the class Ray Serve runs as a region's ingress: its ticket checks,
engine-body allowlist, single-use markers, relay and receipts) served by uvicorn on port 0
(``tests.region_host``), and in the failover test a router (real gRPC server on port 0) with
its ticket issuer, ledger and snapshot on a private ``redis-server``, the regions' own
publishers writing their live state there. Simulated: each pool's engine (``StubEngine``,
streaming as vLLM does), because Ray Serve and vLLM are not what is under test.

1. A ticket signed for one chat request, and that request changed one way (Hypothesis draws
   which): another endpoint, ``prompt`` added beside ``messages``, any engine field added or
   changed, a key added to a message, another model, more output tokens, more completions:
   every one is refused with 403 before any engine runs; the unchanged request streams.
2. A clock-skew sweep: the router's clock from 45 s behind to 12 s ahead of the region's,
   with the default tolerance (5 s) and a wider one (``ticket_clock_skew_s``): a ticket is
   accepted exactly when it is neither expired beyond the tolerance nor dated further ahead
   than its 30 s lifetime plus the tolerance.
3. The first region a dispatch goes to hangs 61 s (its engine sends nothing): the router's
   60 s read timeout ends the attempt and the next region, given a ticket of its own with its
   own expiry, serves the request. One ticket for the whole dispatch (30 s) would have expired.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.client import AsyncSchedulerClient
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.server.app import build_deps, start_router, with_services
from scheduler.state.redis_store import RedisStore
from scheduler.tickets import (
    CHAT_COMPLETIONS,
    CLOCK_SKEW_S,
    COMPLETIONS,
    DIGEST_EXCLUDED,
    ENGINE_FIELDS,
    HEADER,
    MAX_TICKET_TTL_S,
    Ticket,
    TicketKeyRing,
    body_digest,
)
from tests.faults.redis_server import PrivateRedis
from tests.region_host import EngineTally, InProcessRegion, StubEngine, start_gateway

pytestmark = [pytest.mark.integration]

REGION = "eu-north"
REGIONS = ("eu-north", "eu-central", "us-east")
MODEL = "llama-3.1-8b"
BODY: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
                        "stream": True}
# A value for every digested engine field that differs from what the request above carries.
FIELD_VALUES: dict[str, Any] = {
    "prompt": "X" * 20_000, "messages": [{"role": "user", "content": "hello, and now something else"}],
    "temperature": 1.7, "top_p": 0.5, "top_k": 7, "min_p": 0.2, "seed": 1234, "stop": ["\n"],
    "presence_penalty": 1.5, "frequency_penalty": 1.5, "repetition_penalty": 1.3, "logprobs": True,
    "top_logprobs": 5, "logit_bias": {"42": 100}, "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "required", "parallel_tool_calls": False, "user": "someone-else", "min_tokens": 3,
    "ignore_eos": True, "echo": True, "reasoning_effort": "high", "stop_token_ids": [2],
    "include_stop_str_in_output": True, "skip_special_tokens": False,
    "chat_template_kwargs": {"enable_thinking": True},
}


def engines_of(region: str) -> dict[str, StubEngine]:
    pools = next(r for r in load_fleet().regions if r.name == region).pools
    return {p.name: StubEngine(p.name, EngineTally(region, None)) for p in pools}


def signed(ring: TicketKeyRing, body: dict[str, Any], *, endpoint: str = CHAT_COMPLETIONS, pool: str = "",
           expires_at: float | None = None) -> dict[str, str]:
    """The ticket the router signs for ``body``, as a request header."""
    digest = body_digest(body)
    assert digest is not None
    ticket = Ticket(decision_id=uuid.uuid4().hex, request_id="contract", tenant="tenant-a", region=REGION,
                    pool=pool, model=body["model"], max_tokens=body["max_tokens"], prompt_tokens_max=4096,
                    body_sha256=digest[0], expires_at=time.time() + MAX_TICKET_TTL_S if expires_at is None
                    else expires_at, endpoint=endpoint)
    return {HEADER: ticket.sign(ring.of(REGION))}


@asynccontextmanager
async def region(ring: TicketKeyRing, **settings_: Any) -> AsyncIterator[tuple[InProcessRegion, dict[str, StubEngine]]]:
    engines = engines_of(REGION)
    gateway = await start_gateway(REGION, engines, None, "contract", ticket_keys=ring.of(REGION), **settings_)
    async with InProcessRegion(gateway) as served:
        yield served, engines


def first_pool() -> str:
    return next(r for r in load_fleet().regions if r.name == REGION).pools[0].name


async def send(http: httpx.AsyncClient, served: InProcessRegion, body: dict[str, Any], headers: dict[str, str],
               endpoint: str = CHAT_COMPLETIONS) -> tuple[int, str]:
    async with http.stream("POST", served.endpoint + endpoint, json=body, headers=headers) as response:
        text = (await response.aread()).decode()
        return response.status_code, text


def changes() -> st.SearchStrategy[tuple[str, str, Any]]:
    """(kind, name, value): one way to change the request the ticket was signed for."""
    digested = sorted(ENGINE_FIELDS - DIGEST_EXCLUDED - {"messages"})
    return st.one_of(
        st.just(("endpoint", COMPLETIONS, None)),
        st.sampled_from(digested).map(lambda name: ("field", name, FIELD_VALUES[name])),
        st.just(("field", "messages", FIELD_VALUES["messages"])),
        st.tuples(st.just("message-key"), st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
                  .filter(lambda k: k not in {"role", "content", "name", "tool_calls", "tool_call_id"}),
                  st.one_of(st.just("x" * 50_000), st.integers(), st.booleans())),
        st.just(("field", "model", "another-model")),
        st.just(("field", "max_tokens", 4096)),
        st.just(("field", "n", 2)),
    )


@pytest.mark.timeout(240)
async def test_a_ticket_binds_the_endpoint_and_every_field_the_engine_runs() -> None:
    ring = TicketKeyRing.generate([REGION])
    pool = first_pool()
    async with region(ring) as (served, engines), httpx.AsyncClient(timeout=20) as http:
        status, text = await send(http, served, BODY, signed(ring, BODY, pool=pool))
        assert status == 200 and "[DONE]" in text, text
        refused: list[tuple[str, str, int]] = []

        @settings(max_examples=60, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(change=changes())
        def run(change: tuple[str, str, Any]) -> None:
            kind, name, value = change
            body, endpoint = copy.deepcopy(BODY), CHAT_COMPLETIONS
            if kind == "endpoint":
                endpoint = name
            elif kind == "field":
                body[name] = value
            else:
                body["messages"][0][name] = value
            before = sum(e.prompt_tokens_total for e in engines.values())
            headers = signed(ring, BODY, pool=pool)  # signed for the unchanged request
            status, text = asyncio.run_coroutine_threadsafe(send(http, served, body, headers, endpoint), loop).result()
            refused.append((kind, name, status))
            assert status == 403, f"{kind} {name}: {status} {text[:300]}"
            assert sum(e.prompt_tokens_total for e in engines.values()) == before, "an engine ran a refused request"

        loop = asyncio.get_running_loop()
        await asyncio.to_thread(run)
    kinds = sorted({f"{k}:{n}" for k, n, _ in refused})
    print(f"\n{len(refused)} changed requests, all refused with 403; changes drawn: {', '.join(kinds)}")


# The router's clock minus the region's (s), each with whether the region should accept.
SKEWS = (-45.0, -38.0, -33.0, -20.0, 0.0, 3.0, 7.0, 12.0)


def accepted(router_ahead_s: float, tolerance_s: float) -> bool:
    """The region's rule (scheduler.tickets.check) for a ticket that lives MAX_TICKET_TTL_S by
    the router's clock: not expired by more than the tolerance, not dated further ahead than
    its lifetime plus the tolerance."""
    lifetime = MAX_TICKET_TTL_S + router_ahead_s  # its expiry, seen from the region's clock
    return -tolerance_s <= lifetime <= MAX_TICKET_TTL_S + tolerance_s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tolerance_s", [CLOCK_SKEW_S, 10.0], ids=["default-5s", "setting-10s"])
async def test_clock_skew_sweep(tolerance_s: float) -> None:
    ring = TicketKeyRing.generate([REGION])
    pool = first_pool()
    rows: list[str] = []
    async with region(ring, ticket_clock_skew_s=tolerance_s) as (served, _), httpx.AsyncClient(timeout=20) as http:
        for skew in SKEWS:
            expires_at = time.time() + skew + MAX_TICKET_TTL_S
            status, text = await send(http, served, BODY, signed(ring, BODY, pool=pool, expires_at=expires_at))
            rows.append(f"{skew:+.0f} s: {status}")
            assert (status == 200) == accepted(skew, tolerance_s), f"router {skew:+} s ahead: {status} {text[:200]}"
            if status != 200:
                assert status == 401 and "clock-skew tolerance" in text, text
    print(f"\ntolerance {tolerance_s:g} s, router clock ahead of the region's: {'; '.join(rows)}")


@dataclass
class HangingFirst(StubEngine):
    """A pool's engine that, if it gets the first stream of the test, sends nothing for 61 s."""

    first_stream: asyncio.Event = field(default_factory=asyncio.Event)
    hung: bool = False

    async def _stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[list[str | dict[str, Any]]]:
        if not self.first_stream.is_set():
            self.first_stream.set()
            self.hung = True
            await asyncio.sleep(61.0)
        async for batch in super()._stream(body, chat):
            yield batch


@pytest.mark.timeout(180)
async def test_failover_after_a_region_hangs_61_s_gets_a_fresh_ticket(own_redis: PrivateRedis) -> None:
    ring = TicketKeyRing.generate(REGIONS)
    namespace = f"contract-{uuid.uuid4().hex[:8]}"
    shipped = {r.name: r for r in load_fleet().regions}
    # Whichever target the router dispatches to first hangs 61 s before its first token.
    first_stream = asyncio.Event()
    engines = {name: {pool: HangingFirst(pool, EngineTally(name, None), first_stream=first_stream)
                      for pool in engines_of(name)} for name in REGIONS}
    async with AsyncExitStack() as stack:
        served: dict[str, InProcessRegion] = {}
        for name in REGIONS:
            gateway = await start_gateway(name, engines[name], own_redis.url, namespace, ticket_keys=ring.of(name))
            served[name] = await stack.enter_async_context(InProcessRegion(gateway))
        configs = tuple(shipped[n].model_copy(update={"endpoint": served[n].endpoint}) for n in REGIONS)
        store = RedisStore.from_url(own_redis.url, namespace, timeout_s=1.0, connect_timeout_s=0.5)
        stack.push_async_callback(store.close)
        deps = build_deps(SnapshotBuilder(compile_fleet(configs), compile_policy(load_fleet().policy("default"))), store, "redis",
                          rate_limit_rps=1e6, ticket_keys=ring)
        with_services(deps, carbon_pollers=False, budgets={})
        router = await start_router("127.0.0.1:0", deps)
        stack.push_async_callback(router.stop, 1.0)
        client = await stack.enter_async_context(AsyncSchedulerClient(f"127.0.0.1:{router.port}", timeout_s=150))
        prompt = "which hour is cleanest?"
        # The regions' publishers have written their live state: every region is a candidate.
        deadline = time.monotonic() + 30
        while True:
            route = await client.route(prompt, model=MODEL, max_tokens=4)
            if len({c.region for c in route.ranked}) == len(REGIONS) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert len(route.ranked) >= 2, "fewer than two targets: no failover to test"
        started = time.monotonic()
        generation = client.generate(prompt, model=MODEL, max_tokens=4)
        text = await generation.text()
        took = time.monotonic() - started
        receipt = generation.receipt
        assert receipt is not None and text
        hung = [(name, pool) for name in REGIONS for pool, engine in engines[name].items() if engine.hung]
        print(f"\nfirst target {hung} hung 61 s; served by {receipt.region}/{receipt.pool} after {took:.1f} s")
        assert len(hung) == 1, f"targets that hung: {hung}"
        first = hung[0]
        assert (receipt.region, receipt.pool) != first
        assert took >= 60.0, f"served after {took:.1f} s: the first target did not hang past the read timeout"
        served_engine = engines[receipt.region][receipt.pool]
        assert served_engine.generation_tokens_total >= 4
