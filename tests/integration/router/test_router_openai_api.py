"""The OpenAI API as clients send it, against a real router over its HTTP front door and stub
regions (real HTTP servers): the official ``openai`` client with every default-valued field it
may carry, tools and ``response_format`` through to the engine (read at the region, with the
dispatch ticket that binds them), tool calls and logprobs back, the receipt in the last usage
chunk, ``/v1/models``' context lengths, ``/health`` without a key, and LangChain's ``ChatOpenAI``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from scheduler import tickets
from scheduler.server.app import RunningRouter
from scheduler.server.stub_region import STUB_LOGPROB, STUB_TOOL_ARGUMENTS, StubRegionLog
from scheduler.tickets import Ticket, TicketKeyRing

from .conftest import TEST_REGIONS, Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "llama-3.1-8b"
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1}},
                   "required": ["city"]}}}
PERSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"], "additionalProperties": False}}}
# Every field a current client may send at its default value (chat UIs, LangChain, LiteLLM and
# the SDK's own users fill these in): none of them may be refused, none reaches the engine.
DEFAULT_VALUED: dict[str, Any] = {
    "presence_penalty": 0, "frequency_penalty": 0, "n": 1, "logprobs": False, "metadata": {"app": "test"},
    "store": False, "user": "user-1", "service_tier": "auto", "temperature": 1, "top_p": 1,
    "parallel_tool_calls": True, "logit_bias": {},
}
# Those the SDK's completions.create takes as arguments (the rest go in its extra_body).
COMPLETION_ARGUMENTS = {"presence_penalty", "frequency_penalty", "n", "user", "temperature", "top_p", "logit_bias"}
# The region body's own fields (the router's), beside the engine fields a request adds.
BASE_FIELDS = {"model", "max_tokens", "stream", "stream_options", "x_scheduler", "temperature", "top_p"}


def base_url(router: RunningRouter) -> str:
    assert router.http_port is not None
    return f"http://127.0.0.1:{router.http_port}"


def region_log(fleet: Fleet, region: str) -> StubRegionLog:
    return fleet.regions[region].log


def last_body(fleet: Fleet, region: str) -> tuple[dict[str, Any], dict[str, str]]:
    log = region_log(fleet, region)
    return log.bodies[-1], log.headers[-1]


def check_ticket(ring: TicketKeyRing, region: str, body: dict[str, Any], headers: dict[str, str],
                 endpoint: str) -> Ticket:
    """What a region's gateway checks: the ticket is valid for this very body (its digest binds
    the engine fields), and the body passes the gateway's allowlist."""
    scheduler_info = dict(body)
    hints = scheduler_info.pop("x_scheduler")
    ticket = Ticket.verify(ring.of(region), headers[tickets.HEADER])
    tickets.check(ticket, region=region, now=time.time(), body=tickets.engine_body(scheduler_info),
                  pool=hints["pool"], endpoint=endpoint)
    return ticket


async def test_chat_and_completions_with_every_default_valued_field(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            max_completion_tokens=3, top_logprobs=0, modalities=["text"], prompt_cache_key="k1",
            safety_identifier="s1", **DEFAULT_VALUED)
        chat_region = (chat.model_extra or {})["energy_receipt"]["region"]
        chat_body, _ = last_body(stub_fleet, chat_region)
        completion_fields = {k: v for k, v in DEFAULT_VALUED.items() if k in COMPLETION_ARGUMENTS}
        completion = await client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=2, echo=False, best_of=1, suffix=None, **completion_fields,
            extra_body={k: v for k, v in DEFAULT_VALUED.items() if k not in COMPLETION_ARGUMENTS})
        completion_region = (completion.model_extra or {})["energy_receipt"]["region"]
        completion_body, _ = last_body(stub_fleet, completion_region)
    finally:
        await client.close()
    assert chat.choices[0].message.content == "lorem ipsum dolor "
    assert completion.choices[0].text == "lorem ipsum "
    # Defaults are as if absent: nothing the engine would have to honour was added.
    assert set(chat_body) == BASE_FIELDS | {"messages"}, set(chat_body)
    assert set(completion_body) == BASE_FIELDS | {"prompt"}, set(completion_body)
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens == 0


async def test_tools_and_response_format_reach_the_engine_under_the_ticket(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    ring = TicketKeyRing.generate(TEST_REGIONS)
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True, ticket_keys=ring)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    question = [{"role": "user", "content": "Weather in Paris?"}]
    named = {"type": "function", "function": {"name": "weather"}}
    try:
        called = await client.chat.completions.create(model=MODEL, messages=question, max_tokens=16,
                                                      tools=[WEATHER], tool_choice=named, extra_body={"top_k": 20})
        region = (called.model_extra or {})["energy_receipt"]["region"]
        tool_body, tool_headers = last_body(stub_fleet, region)
        structured = await client.chat.completions.create(model=MODEL, messages=question, max_tokens=4,
                                                          response_format=PERSON_SCHEMA)  # type: ignore[arg-type]
        structured_region = (structured.model_extra or {})["energy_receipt"]["region"]
        schema_body, schema_headers = last_body(stub_fleet, structured_region)
        streamed = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=question, max_tokens=16, tools=[WEATHER], stream=True)]
        call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
        answered = await client.chat.completions.create(model=MODEL, max_tokens=2, tools=[WEATHER], tool_choice="none",
                                                        messages=[*question, called.choices[0].message.model_dump(
                                                            exclude_none=True),
                                                            {"role": "tool", "tool_call_id": call.id, "content": "12 C"}])
        answer_region = (answered.model_extra or {})["energy_receipt"]["region"]
        turn_body, turn_headers = last_body(stub_fleet, answer_region)
    finally:
        await client.close()

    # At the region: the engine body carries them as sent, under a ticket that binds them.
    assert tool_body["tools"] == [WEATHER] and tool_body["tool_choice"] == named and tool_body["top_k"] == 20
    check_ticket(ring, region, tool_body, tool_headers, tickets.CHAT_COMPLETIONS)
    assert schema_body["response_format"] == PERSON_SCHEMA
    check_ticket(ring, structured_region, schema_body, schema_headers, tickets.CHAT_COMPLETIONS)
    assert turn_body["messages"][1]["tool_calls"][0]["id"] == "call_stub"
    assert turn_body["messages"][2] == {"role": "tool", "content": "12 C", "tool_call_id": "call_stub"}
    check_ticket(ring, answer_region, turn_body, turn_headers, tickets.CHAT_COMPLETIONS)

    # Back at the client: the engine's tool call, whole and streamed.
    assert called.choices[0].finish_reason == "tool_calls" and called.choices[0].message.content is None
    assert (call.id, call.function.name, call.function.arguments) == ("call_stub", "weather",  # type: ignore[union-attr]
                                                                      "".join(STUB_TOOL_ARGUMENTS))
    deltas = [tc for c in streamed if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function is not None and deltas[0].function.name == "weather"
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == "".join(STUB_TOOL_ARGUMENTS)
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    assert answered.choices[0].message.content == "lorem ipsum "


async def test_a_streamed_answer_carries_its_receipt_in_the_last_usage_chunk(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True, logprobs=True,
            top_logprobs=1, stream_options={"include_usage": True}, presence_penalty=0, n=1)]
        texts = [c async for c in await client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=2, stream=True, stream_options={"include_usage": True})]
    finally:
        await client.close()
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    receipt = (last.usage.model_extra or {})["energy_receipt"]
    assert receipt["energy_j"] > 0 and receipt["completion_tokens"] == 3 and receipt["region"] in TEST_REGIONS
    assert last.usage.completion_tokens == 3
    assert last.usage.prompt_tokens_details is not None and last.usage.prompt_tokens_details.cached_tokens == 0
    logprobs = [lp for c in chunks if c.choices and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content or []]
    assert [lp.token for lp in logprobs] == ["lorem ", "ipsum ", "dolor "]
    assert {lp.logprob for lp in logprobs} == {STUB_LOGPROB}
    assert texts[-1].usage is not None and (texts[-1].usage.model_extra or {})["energy_receipt"]["completion_tokens"] == 2


async def test_models_give_context_lengths_and_health_needs_no_key(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        models = {m.id: m for m in (await client.models.list()).data}
    finally:
        await client.close()
    snapshot = router.deps.refresher.current()
    context = max(c.kv_capacity_tokens for c in snapshot.candidates_by_model[MODEL])
    assert (models[MODEL].model_extra or {})["max_model_len"] == context > 0
    async with httpx.AsyncClient() as http:
        health = await http.get(base_url(router) + "/health")
        models_without_key = await http.get(base_url(router) + "/v1/models")
        router.serving = False  # as while it drains
        draining = await http.get(base_url(router) + "/health")
        router.serving = True
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert draining.status_code == 503
    assert models_without_key.status_code == 401


async def test_refusals_name_the_field_and_value(stub_fleet: Fleet, make_router: RouterFactory, keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as several:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2)
        with pytest.raises(openai.BadRequestError) as search:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 web_search_options={"search_context_size": "low"})
        with pytest.raises(openai.BadRequestError) as tools_on_text:
            await client.completions.create(model=MODEL, prompt="Hi", extra_body={"tools": [WEATHER]})
    finally:
        await client.close()
    assert isinstance(several.value.body, dict) and several.value.body["param"] == "n"
    assert "n=1" in several.value.message and "got 2" in several.value.message
    assert isinstance(search.value.body, dict) and search.value.body["param"] == "web_search_options"
    assert "search_context_size" in search.value.message
    assert isinstance(tools_on_text.value.body, dict) and tools_on_text.value.body["param"] == "tools"
    assert "chat completions only" in tools_on_text.value.message


async def test_langchain_chat_openai_calls_the_router(stub_fleet: Fleet, make_router: RouterFactory,
                                                      keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)

    def use_langchain() -> tuple[Any, Any]:
        chat = ChatOpenAI(model=MODEL, base_url=base_url(router) + "/v1", api_key=keys.tenant.key,  # type: ignore[arg-type]
                          max_retries=0)
        # No max_tokens: the router's chat default (up to the context, within the policy's cap).
        answer = chat.invoke("Say something.")
        tool_answer = chat.bind_tools([WEATHER], tool_choice="weather").invoke("Weather in Paris?")
        return answer, tool_answer

    answer, tool_answer = await asyncio.to_thread(use_langchain)
    cap = router.deps.refresher.current().policy.chat_default_max_tokens
    assert answer.content.startswith("lorem ipsum dolor")
    assert answer.usage_metadata["output_tokens"] == cap
    assert tool_answer.tool_calls[0]["name"] == "weather" and tool_answer.tool_calls[0]["args"] == {"city": "Paris"}
