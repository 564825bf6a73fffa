"""OpenAI's Batch API on the router's deferral queue, driven by the official ``openai`` client
from file upload to results: each request deferred to the cleanest window of its 24 h, run
through the same path as a live one (stub regions), and its output line carrying its receipt;
a bad line refuses the whole batch by line and field; cancelling drops what is still held."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from scheduler.server.app import RunningRouter
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.state.memory_store import MemoryStore

from .conftest import TEST_REGIONS, Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "llama-3.1-8b"


def base_url(router: RunningRouter) -> str:
    assert router.http_port is not None
    return f"http://127.0.0.1:{router.http_port}"


def jsonl(*lines: object) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, content: str, max_tokens: int) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                     "presence_penalty": 0, "temperature": 0}}


async def finished(client: openai.AsyncOpenAI, batch_id: str, wait_s: float = 30.0) -> openai.types.Batch:
    for _ in range(int(wait_s / 0.2)):
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "cancelled", "failed", "expired"):
            return batch
        await asyncio.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {wait_s} s")


async def test_a_batch_from_upload_to_results_with_a_receipt_per_line(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=MemoryStore(), http=True,
                               deferral=DeferralSettings(interval_s=0.1))
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        uploaded = await client.files.create(
            file=("requests.jsonl", jsonl(chat_line("q-1", "Hi", 2), chat_line("q-2", "Hello there", 3))),
            purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                            completion_window="24h", metadata={"job": "nightly"})
        assert batch.status == "in_progress" and batch.request_counts is not None
        assert batch.request_counts.total == 2
        done = await finished(client, batch.id)
        assert done.output_file_id is not None
        output = (await client.files.content(done.output_file_id)).content
        echoed = (await client.files.content(uploaded.id)).content
        with pytest.raises(openai.NotFoundError):
            await openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.other_tenant.key,
                                     max_retries=0).batches.retrieve(batch.id)
    finally:
        await client.close()

    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (2, 0)
    assert done.metadata == {"job": "nightly"} and done.expires_at == done.created_at + 86400
    assert echoed == jsonl(chat_line("q-1", "Hi", 2), chat_line("q-2", "Hello there", 3))
    lines = {line["custom_id"]: line for line in map(json.loads, output.splitlines())}
    assert set(lines) == {"q-1", "q-2"}
    for custom_id, words in (("q-1", "lorem ipsum "), ("q-2", "lorem ipsum dolor ")):
        response = lines[custom_id]["response"]
        assert response["status_code"] == 200 and lines[custom_id]["error"] is None
        body = response["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == words
        assert body["choices"][0]["finish_reason"] == "length"
        receipt = body["energy_receipt"]
        assert receipt["energy_j"] > 0 and receipt["region"] in TEST_REGIONS
        assert receipt["completion_tokens"] == body["usage"]["completion_tokens"] == len(words.split())
        assert receipt["deferral"].startswith("no-forecast")  # the test fleet has no forecast: run at once


async def test_a_bad_line_refuses_the_batch_and_cancel_drops_what_is_held(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=MemoryStore(), http=True,
                               deferral=DeferralSettings(interval_s=3600.0))  # nothing released here
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    streamed = {**chat_line("s", "Hi", 2), "body": {**chat_line("s", "Hi", 2)["body"], "stream": True}}
    try:
        bad = await client.files.create(file=("bad.jsonl", jsonl(
            chat_line("a", "Hi", 2), streamed, {**chat_line("a", "Hi", 2)}, {"custom_id": "c", "method": "GET"})),
            purpose="batch")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        with pytest.raises(openai.BadRequestError) as window:
            await client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions",
                                        completion_window="1h")  # type: ignore[arg-type]
        good = await client.files.create(file=("good.jsonl", jsonl(chat_line("x", "Hi", 2))), purpose="batch")
        batch = await client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        cancelled = await client.batches.cancel(batch.id)
        errors_file = (await client.files.content(cancelled.error_file_id or "")).content
    finally:
        await client.close()
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "input_file.line[2].body.stream"
    assert "line[3].custom_id" in refused.value.message and "line[4].url" in refused.value.message
    assert isinstance(window.value.body, dict) and window.value.body["param"] == "completion_window"
    assert cancelled.status == "cancelled" and cancelled.request_counts is not None
    assert (cancelled.request_counts.completed, cancelled.request_counts.failed) == (0, 1)
    error_line = json.loads(errors_file)
    assert error_line["custom_id"] == "x" and error_line["response"] is None
    assert error_line["error"]["code"] == "failed_precondition" and "cancelled" in error_line["error"]["message"]
