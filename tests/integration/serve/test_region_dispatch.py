"""The region carries out the router's decision and nothing else: dispatch tickets, one
deployment per pool, direct and proxy mode both billed (real Ray Serve + vLLM CPU engines).

Runs before test_region_stack.py (file order), which takes the region down at its end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

import httpx
import pytest

from scheduler.client import AsyncSchedulerClient
from scheduler.ledger.ledger import month_of, parse_month
from scheduler.region.stack import LocalStack
from scheduler.region.tiny_model import TINY_MODEL
from scheduler.state import keys
from scheduler.state.factory import open_store
from scheduler.tickets import HEADER as TICKET_HEADER
from scheduler.tickets import RegionKeys, Ticket, body_digest
from tests.integration.serve.conftest import REGION, ticket_headers

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODEL = "llama-3.1-8b"
BODY: dict[str, Any] = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "stream": True}
# ~900 tokens of the tiny model's tokenizer: more than a100-batch's engine takes (512).
LONG_PROMPT = "Wind and sun move the grid's carbon intensity from hour to hour, region to region. " * 45


def _forge(headers: dict[str, str], **changes: Any) -> dict[str, str]:
    """The same signature over claims changed by ``changes`` (what a tamperer can do)."""
    version, kid, body, mac = headers[TICKET_HEADER].split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims.update(changes)
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return {TICKET_HEADER: ".".join((version, kid, forged, mac))}


@pytest.mark.timeout(120)
async def test_the_region_refuses_every_dispatch_the_router_did_not_sign_for_it(stack: LocalStack) -> None:
    url = f"{stack.endpoint(REGION)}/v1/completions"
    foreign = RegionKeys.generate(REGION, kid="someone-elses")
    digest = body_digest(BODY)
    assert digest is not None
    stranger = Ticket(decision_id="x", request_id="x", tenant="x", region=REGION, pool="h200-long", model=MODEL,
                      max_tokens=3, prompt_tokens_max=8, body_sha256=digest[0], expires_at=time.time() + 30)
    cases: list[tuple[str, dict[str, Any], dict[str, str], int, str]] = [
        ("unsigned", BODY, {}, 401, "no dispatch ticket"),
        # (past the gateway's clock-skew tolerance, 5 s by default)
        ("expired", BODY, ticket_headers(stack, BODY, expires_at=time.time() - 10), 401, "ticket expired"),
        ("tampered: another pool", BODY, _forge(ticket_headers(stack, BODY), pool="a100-batch"), 401,
         "bad ticket signature"),
        ("tampered: higher max_tokens", BODY, _forge(ticket_headers(stack, BODY), max_tokens=4000), 401,
         "bad ticket signature"),
        ("the request asks for another pool", {**BODY, "x_scheduler": {"pool": "a100-batch"}},
         ticket_headers(stack, BODY), 403, "ticket is for pool h200-long"),
        ("the request asks for more tokens", {**BODY, "max_tokens": 64}, ticket_headers(stack, BODY), 403,
         "exceeds the ticket's 3"),
        ("another prompt", {**BODY, "prompt": "Goodbye"}, ticket_headers(stack, BODY), 403,
         "not the one the ticket was issued for"),
        ("a ticket for another region", BODY, ticket_headers(stack, BODY, region="us-east", sign_as=REGION), 403,
         "ticket is for region us-east"),
        ("signed with a key this region does not have", BODY, {TICKET_HEADER: stranger.sign(foreign)}, 401,
         "unknown key id"),
    ]
    replayed = ticket_headers(stack, BODY)
    async with httpx.AsyncClient(timeout=60) as client:
        refused = {name: await client.post(url, json=body, headers=headers) for name, body, headers, _, _ in cases}
        first = await client.post(url, json=BODY, headers=replayed)
        again = await client.post(url, json=BODY, headers=replayed)
    for name, _, _, status, reason in cases:
        answer = refused[name]
        assert answer.status_code == status, f"{name}: {answer.status_code} {answer.text}"
        assert reason in answer.json()["error"]["message"], f"{name}: {answer.text}"
    assert first.status_code == 200 and "[DONE]" in first.text
    assert again.status_code == 403 and "ticket already used" in again.json()["error"]["message"]


@pytest.mark.timeout(180)
async def test_a_long_context_request_runs_on_the_long_pool(stack: LocalStack) -> None:
    async with AsyncSchedulerClient(stack.router_target) as client:
        decision = await client.route(LONG_PROMPT, model=MODEL, max_tokens=8)
        generation = client.generate(LONG_PROMPT, model=MODEL, max_tokens=8)
        await generation.text()
    # The router knew from the region's live state that a100-batch's engine holds 512 tokens...
    assert [(c.region, c.pool) for c in decision.ranked] == [(REGION, "h200-long")]
    rejected = {(r.region, r.pool): r for r in decision.rejected}
    assert rejected[(REGION, "a100-batch")].plugin == "pool-served"
    assert "exceed the served context limit 512" in rejected[(REGION, "a100-batch")].reason
    # ...the request ran there...
    receipt = generation.receipt
    assert receipt is not None and receipt.pool == "h200-long" and receipt.prompt_tokens > 512
    # ...and a100-batch is a different engine, which refuses the prompt (a ticket for it is
    # signed here as the router would, had it chosen so).
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}
    async with httpx.AsyncClient(timeout=60) as http:
        short_pool = await http.post(f"{stack.endpoint(REGION)}/v1/completions", json=body,
                                     headers=ticket_headers(stack, body, pool="a100-batch"))
    assert short_pool.status_code == 400
    assert "512" in short_pool.text


async def _ledger_requests(stack: LocalStack, tenant: str, want: int, timeout_s: float = 15.0) -> float:
    store = open_store(stack.state_url, stack.namespace)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            month = month_of(time.time())
            used = parse_month(tenant, month, await store.hgetall(keys.ledger(tenant, month)))
            if used.requests >= want or time.monotonic() > deadline:
                return used.requests
            await asyncio.sleep(0.25)
    finally:
        await store.close()


@pytest.mark.timeout(120)
async def test_direct_and_proxy_mode_both_end_with_a_receipt_in_the_ledger(stack: LocalStack) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    async with AsyncSchedulerClient(stack.router_target) as client:
        proxied = client.generate("Where does this run?", model=MODEL, max_tokens=4, tenant=tenant)
        proxied_text = await proxied.text()
        direct = client.generate("And this one?", model=MODEL, max_tokens=4, tenant=tenant, mode="direct")
        direct_text = await direct.text()
    assert proxied_text and direct_text
    for generation in (proxied, direct):
        receipt = generation.receipt
        decision = generation.decision
        assert receipt is not None and decision is not None
        assert receipt.region == REGION and receipt.pool == decision.ranked[0].pool
        assert receipt.decision_id == decision.decision_id
        assert receipt.energy_j > 0 and receipt.completion_tokens > 0
    assert await _ledger_requests(stack, tenant, 2) == 2
    # Both are in the audit stream too, under their decision ids.
    store = open_store(stack.state_url, stack.namespace)
    try:
        audited = {body.get("decision_id") for _, body in await store.xrange(keys.AUDIT, 10_000)}
    finally:
        await store.close()
    assert {proxied.receipt.decision_id, direct.receipt.decision_id} <= audited  # type: ignore[union-attr]


@pytest.mark.timeout(120)
async def test_the_openai_front_door_and_direct_mode_over_http_reach_the_real_region(stack: LocalStack) -> None:
    """The official openai client through the router's HTTP front door to a real vLLM region,
    and the SDK's direct mode with Route over HTTP (the real gateway checks the tickets)."""
    import openai

    assert stack.router_http is not None
    client = openai.AsyncOpenAI(base_url=stack.router_http + "/v1", api_key="unused", max_retries=0)
    try:
        chat = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=4)
        parsed = chat.parse()
        chunks = [c async for c in await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4,
                                                                   stream=True)]
    finally:
        await client.close()
    assert parsed.choices[0].message.content and parsed.usage is not None and parsed.usage.completion_tokens > 0
    receipt = (parsed.model_extra or {})["energy_receipt"]
    assert receipt["region"] == REGION and receipt["pool"] in ("h200-long", "a100-batch") and receipt["energy_j"] > 0
    assert chat.headers["x-energy-region"] == REGION
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    async with AsyncSchedulerClient(stack.router_target, http_url=stack.router_http) as sdk:
        direct = sdk.generate("And this one over HTTP?", model=MODEL, max_tokens=4, mode="direct")
        assert await direct.text()
        # The SDK's proxy mode over the front door (Connect streaming): the router relays the region.
        proxied = sdk.generate("And this one through the router over HTTP?", model=MODEL, max_tokens=4)
        assert await proxied.text()
    assert direct.receipt is not None and direct.receipt.region == REGION and direct.receipt.energy_j > 0
    assert proxied.receipt is not None and proxied.decision is not None
    assert (proxied.receipt.region, proxied.receipt.pool) == (REGION, proxied.decision.ranked[0].pool)
    assert proxied.receipt.energy_j > 0 and proxied.receipt.completion_tokens > 0
    assert direct.receipt.precision == "bf16"  # as the region's config serves the model on that pool


async def _region_receipt(stack: LocalStack, decision_id: str, timeout_s: float = 15.0) -> dict[str, Any]:
    """The region's signed receipt of ``decision_id`` once its outbox wrote it to the store."""
    from scheduler.signed_region_receipt import STREAM, verify_receipt

    assert stack.ticket_keys is not None
    store = open_store(stack.state_url, stack.namespace)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            for _, entry in await store.xrange(STREAM, 100_000):
                claims = verify_receipt(stack.ticket_keys.of(REGION), entry)
                if claims["decision_id"] == decision_id:
                    return claims
            assert time.monotonic() < deadline, f"no region receipt of {decision_id}"
            await asyncio.sleep(0.25)
    finally:
        await store.close()


@pytest.mark.timeout(180)
async def test_a_stream_cut_after_two_tokens_is_billed_on_the_engines_counts(stack: LocalStack) -> None:
    """vLLM's running usage (continuous_usage_stats, through Ray Serve LLM) and its tokenizer
    behind ``RegionLLMServer.prompt_tokens`` give the region's receipt of a cut stream the
    engine's own counts: the prompt a complete run of the same prompt reports, and at least
    the tokens the client read."""
    from ray import serve

    prompt = LONG_PROMPT[:300]
    url = f"{stack.endpoint(REGION)}/v1/completions"
    complete = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
    cut = {**complete, "max_tokens": 48}
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(url, json=complete, headers=ticket_headers(stack, complete, decision_id=ids[0],
                                                                                mode="direct"))
        read = 0
        async with client.stream("POST", url, json=cut,
                                 headers=ticket_headers(stack, cut, decision_id=ids[1], mode="proxy")) as response:
            async for line in response.aiter_lines():
                read += line.startswith("data: {") and '"choices":[{' in line
                if read == 2:
                    break
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    engine_prompt = events[-1]["usage"]["prompt_tokens"]
    claims = await _region_receipt(stack, ids[1])
    print(f"\nengine's prompt {engine_prompt} tokens; cut after 2 read: the region billed {claims['usage']}")
    assert (await _region_receipt(stack, ids[0]))["end_reason"] == "complete"
    assert claims["partial"] and claims["end_reason"] == "cancelled" and not claims["tokens_estimated"]
    assert claims["usage"]["prompt_tokens"] == engine_prompt and 2 <= claims["usage"]["completion_tokens"] < 48
    # What the gateway asks when a client leaves before any usage came: the same count.
    app = serve.status().applications[REGION]
    engine = next(name for name in app.deployments if name.startswith(f"LLMServer:{REGION}:h200-long:"))
    handle = serve.get_deployment_handle(engine, app_name=REGION)
    served = {**complete, "model": TINY_MODEL}  # the engine's body names the model it runs
    assert await handle.prompt_tokens.remote(served, "stream_completions") == engine_prompt
    # A chat's prompt is counted through the engine's chat template, as its usage says.
    chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "stream": True}
    async with httpx.AsyncClient(timeout=60) as client:
        chat_answer = await client.post(f"{stack.endpoint(REGION)}/v1/chat/completions", json=chat,
                                        headers=ticket_headers(stack, chat, mode="direct"))
    chat_events = [json.loads(line[6:]) for line in chat_answer.text.splitlines() if line.startswith("data: {")]
    chat_prompt = chat_events[-1]["usage"]["prompt_tokens"]
    assert await handle.prompt_tokens.remote({**chat, "model": TINY_MODEL}, "stream_chat") == chat_prompt
