"""OpenAI requests into GenerateRequests (the front door's conversion), and its answers' shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from scheduler.errors import InvalidRequest
from scheduler.server import openai_front
from scheduler.server.dispatch import TextDelta
from scheduler.v1 import messages_pb2 as pb


@dataclass
class Case:
    name: str
    body: Any
    chat: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    # expected: field path fragments of the violations (empty: accepted)
    bad: tuple[str, ...] = ()


BASE = {"model": "llama-3.1-8b", "prompt": "Hi"}
CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}]}

CASES = [
    Case("a plain completion", BASE),
    Case("a plain chat", CHAT, chat=True),
    Case("chat content as text parts", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, chat=True),
    Case("an image part is refused", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, chat=True, bad=("messages[0].content",)),
    Case("no model", {"prompt": "Hi"}, bad=("model",)),
    Case("a token-id prompt", {**BASE, "prompt": [1, 2, 3]}, bad=("prompt",)),
    Case("tools are refused, not dropped", {**CHAT, "tools": [{"type": "function"}]}, chat=True, bad=("tools",)),
    Case("n > 1", {**BASE, "n": 2}, bad=("n",)),
    Case("max_tokens 0", {**BASE, "max_tokens": 0}, bad=("max_tokens",)),
    Case("max_tokens as a string", {**BASE, "max_tokens": "8"}, bad=("max_tokens",)),
    Case("an unknown hint", {**BASE, "x_scheduler": {"region": "eu-north"}}, bad=("x_scheduler.region",)),
    Case("a bad workload class", {**BASE, "x_scheduler": {"workload_class": "urgent"}},
         bad=("x_scheduler.workload_class",)),
    Case("a bad location", {**BASE, "x_scheduler": {"client_location": "paris"}}, bad=("x_scheduler.client_location",)),
    Case("a bad workflow shape", {**BASE, "x_scheduler": {"workflow_id": "w", "workflow_shape": "star"}},
         bad=("x_scheduler.workflow_shape",)),
    Case("a bad ttft header", BASE, headers={"x-scheduler-ttft-ms": "soon"}, bad=("x-scheduler-ttft-ms",)),
    Case("not an object", ["prompt"], bad=("body",)),
    Case("every violation at once", {"prompt": 3, "max_tokens": -1, "n": 3}, bad=("model", "prompt", "max_tokens", "n")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_requests_are_converted_or_refused_by_field(case: Case) -> None:
    if not case.bad:
        msg, call = openai_front.generate_request(case.body, case.headers, case.chat)
        assert msg.model == "llama-3.1-8b" and call.chat == case.chat
        assert msg.WhichOneof("input") == ("chat" if case.chat else "prompt")
        return
    with pytest.raises(InvalidRequest) as refused:
        openai_front.generate_request(case.body, case.headers, case.chat)
    fields = [v.field for v in refused.value.violations]
    assert all(any(f.startswith(want) for f in fields) for want in case.bad), fields


def test_hints_come_from_the_body_over_the_headers_and_defaults_follow_openai() -> None:
    headers = {"x-scheduler-jurisdictions": "EU, UK", "x-scheduler-workload-class": "batch",
               "x-scheduler-client-location": "48.85,2.35", "x-scheduler-deadline-ms": "1500",
               "x-scheduler-ttft-ms": "800"}
    body = {**CHAT, "x_scheduler": {"ttft_ms": 400, "certifications": ["ISO27001"], "prompt_tokens": 12}}
    msg, call = openai_front.generate_request(body, headers, chat=True)
    assert list(msg.compliance.allowed_jurisdictions) == ["EU", "UK"]
    assert list(msg.compliance.required_certifications) == ["ISO27001"]
    assert msg.workload_class == pb.WORKLOAD_CLASS_BATCH
    assert msg.slo.ttft_ms == 400  # the body wins over the header
    assert (msg.client_location.lat, msg.client_location.lon) == (48.85, 2.35)
    assert msg.prompt_tokens == 12 and call.remaining_s == 1.5
    assert msg.sampling.max_tokens == openai_front.DEFAULT_CHAT_MAX_TOKENS
    completion, _ = openai_front.generate_request(BASE, {}, chat=False)
    assert completion.sampling.max_tokens == 16  # OpenAI's default for completions
    chat_limit, _ = openai_front.generate_request({**CHAT, "max_completion_tokens": 7}, {}, chat=True)
    assert chat_limit.sampling.max_tokens == 7
    fan, _ = openai_front.generate_request(CHAT, {"x-scheduler-workflow-id": "fan-3", "x-scheduler-workflow-shape":
                                                  "fanout", "x-scheduler-shared-prefix-tokens": "512"}, chat=True)
    assert (fan.workflow_id, fan.workflow_shape, fan.shared_prefix_tokens) == ("fan-3", pb.WORKFLOW_SHAPE_FANOUT, 512)


@pytest.mark.parametrize("model", ["llama-3.1-8b", 'a"b\\c', "has\x00nul", "\x00"])
def test_a_completion_chunk_is_the_same_bytes_on_its_fast_path(model: str) -> None:
    call = openai_front.OpenAiCall(chat=False, model=model, stream=True, include_usage=False, remaining_s=None)
    writer = openai_front.ChunkWriter(call, "abc", created=1)
    for text in ("Hel", "", 'q"uote\\', "\x00", "\u2028é\U0001F600", "x" * 5000):
        whole = writer._event([{"index": 0, "text": text, "logprobs": None, "finish_reason": None}])
        assert writer.delta(TextDelta(text)) == whole
        assert orjson.loads(whole[6:])["choices"][0]["text"] == text
    # The whole model name is the marker: every chunk is serialised whole.
    assert (writer._text_chunk is None) == (model == "\x00")


def test_stream_events_are_openai_chunks() -> None:
    call = openai_front.OpenAiCall(chat=True, model="m", stream=True, include_usage=True, remaining_s=None)
    writer = openai_front.ChunkWriter(call, "abc", created=1)
    first = orjson.loads(writer.delta(TextDelta("Hel"))[6:])
    second = orjson.loads(writer.delta(TextDelta("lo", "stop"))[6:])
    usage = orjson.loads(writer.usage({"prompt_tokens": 3, "completion_tokens": 2}, None)[6:])
    assert first["id"] == "chatcmpl-abc" and first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"content": "Hel", "role": "assistant"}
    assert second["choices"][0]["delta"] == {"content": "lo"} and second["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert writer.done() == b"data: [DONE]\n\n"
