"""OpenAI requests into GenerateRequests (the front door's conversion), and its answers' shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from scheduler import tickets
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.errors import InvalidRequest
from scheduler.server import http_api, openai_front
from scheduler.server.dispatch import TextDelta, merge_fields
from scheduler.types import EnergyReceipt
from scheduler.v1 import messages_pb2 as pb

NOW = 1_767_225_600.0


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
    Case("tools on a completion are refused, not dropped", {**BASE, "tools": [{"type": "function"}]}, bad=("tools",)),
    Case("echo on a chat is refused", {**CHAT, "echo": True}, chat=True, bad=("echo",)),
    Case("a field no engine reads", {**CHAT, "functions": [{"name": "f"}]}, chat=True, bad=("functions",)),
    Case("a field no engine reads, at any value", {**CHAT, "web_search_options": {}}, chat=True,
         bad=("web_search_options",)),
    Case("n > 1", {**BASE, "n": 2}, bad=("n",)),
    Case("best_of > 1", {**BASE, "best_of": 3}, bad=("best_of",)),
    Case("audio out", {**CHAT, "modalities": ["text", "audio"]}, chat=True, bad=("modalities",)),
    Case("a message key no engine reads", {**CHAT, "messages": [{"role": "user", "content": "Hi", "audio": {"id": 1}}]},
         chat=True, bad=("messages[0].audio",)),
    Case("tool calls that are not a list", {**CHAT, "messages": [{"role": "assistant", "tool_calls": "f()"}]},
         chat=True, bad=("messages[0].tool_calls",)),
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


# What current clients send with default values (the openai SDK passes on what it is given;
# LangChain, LiteLLM and chat UIs fill these in): accepted, and none of them reaches the engine.
DEFAULT_VALUED = {"presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False, "n": 1, "top_logprobs": 0,
                  "parallel_tool_calls": True, "logit_bias": {}, "tools": [], "stop": [], "store": False,
                  "metadata": {"app": "x"}, "user": "u-1", "service_tier": "auto", "modalities": ["text"],
                  "tool_choice": None, "response_format": None, "seed": None, "stream_options": None,
                  "prompt_cache_key": "k", "safety_identifier": "s", "echo": False, "best_of": 1}


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_default_valued_fields_are_accepted_and_not_passed_on(chat: bool) -> None:
    base = CHAT if chat else BASE
    fields = {k: v for k, v in DEFAULT_VALUED.items()
              if chat or k not in openai_front.CHAT_ONLY_FIELDS or openai_front._is_default(k, v)}
    msg, _ = openai_front.generate_request({**base, **fields}, {}, chat)
    assert msg.engine_fields_json == ""
    assert not msg.sampling.HasField("seed") and not msg.sampling.stop


def test_engine_fields_pass_through_the_ticket_allowlist() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1}}}}}]
    body = {**CHAT, "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"},
            "logprobs": True, "top_logprobs": 2, "presence_penalty": 0.5, "top_k": 20, "user": "u-1",
            "metadata": {"a": "b"}}
    msg, _ = openai_front.generate_request(body, {}, chat=True)
    engine = orjson.loads(msg.engine_fields_json)
    assert engine == {"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"},
                      "logprobs": True, "top_logprobs": 2, "presence_penalty": 0.5, "top_k": 20}
    # One list: every field the front door passes on is one a region's gateway lets through.
    assert openai_front.CHAT_ENGINE_FIELDS | openai_front.COMPLETION_ENGINE_FIELDS <= tickets.ENGINE_FIELDS
    completion, _ = openai_front.generate_request({**BASE, "logprobs": 0, "echo": True}, {}, chat=False)
    assert orjson.loads(completion.engine_fields_json) == {"logprobs": 0, "echo": True}  # 0 is not false


def test_tool_messages_keep_their_calls_ids_and_names() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    body = {**CHAT, "messages": [
        {"role": "user", "content": "Weather?", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": calls, "refusal": None},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]}
    msg, _ = openai_front.generate_request(body, {}, chat=True)
    user, assistant, tool = msg.chat.messages
    assert user.name == "ann" and user.content == "Weather?"
    assert assistant.content == "" and orjson.loads(assistant.tool_calls_json) == calls
    assert tool.tool_call_id == "call_1" and tool.content == "12 C"


def test_a_chat_without_max_tokens_runs_up_to_the_context_within_the_policy_cap() -> None:
    snapshot = SnapshotBuilder(*_fleet()).build(NOW)
    context = openai_front.max_model_len(snapshot, "llama-3.1-8b")
    assert context is not None and context > snapshot.policy.chat_default_max_tokens
    msg, _ = openai_front.generate_request(CHAT, {}, chat=True)
    assert msg.sampling.max_tokens == 0  # left for the fleet's context to fill
    openai_front.fill_chat_max_tokens(msg, snapshot)
    assert msg.sampling.max_tokens == snapshot.policy.chat_default_max_tokens
    long_prompt = {**CHAT, "messages": [{"role": "user", "content": "x" * (4 * context - 4000)}]}
    near_the_end, _ = openai_front.generate_request(long_prompt, {}, chat=True)
    openai_front.fill_chat_max_tokens(near_the_end, snapshot)
    assert 0 < near_the_end.sampling.max_tokens < snapshot.policy.chat_default_max_tokens
    named, _ = openai_front.generate_request({**CHAT, "max_tokens": 9}, {}, chat=True)
    openai_front.fill_chat_max_tokens(named, snapshot)
    assert named.sampling.max_tokens == 9
    assert openai_front.max_model_len(snapshot, "no-such-model") is None


def _fleet() -> tuple[Any, Any]:
    fleet = load_fleet()
    return compile_fleet(fleet.regions), compile_policy(fleet.policy("default"))


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
    assert msg.sampling.max_tokens == 0  # fill_chat_max_tokens decides
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
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                                         "prompt_tokens_details": {"cached_tokens": 0}}
    assert writer.done() == b"data: [DONE]\n\n"


def test_the_usage_chunk_carries_the_receipt_and_the_cached_tokens() -> None:
    call = openai_front.OpenAiCall(chat=True, model="m", stream=True, include_usage=True, remaining_s=None)
    receipt = EnergyReceipt(decision_id="d1", request_id="r1", tenant="t", model="m", region="eu-north", pool="p", pue=1.1,
                            measurement_source="model", attribution_method="a", energy_j=2.5, prompt_tokens=30,
                            completion_tokens=2, reused_tokens=16)
    usage = orjson.loads(openai_front.ChunkWriter(call, "abc").usage(
        {"prompt_tokens": 30, "completion_tokens": 2}, receipt)[6:])["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 16}  # the receipt's, when the region said none
    assert usage["energy_receipt"]["energy_j"] == 2.5 and usage["energy_receipt"]["decision_id"] == "d1"
    region_said = openai_front.usage_object({"prompt_tokens": 30, "completion_tokens": 2,
                                             "prompt_tokens_details": {"cached_tokens": 24}}, receipt)
    assert region_said["prompt_tokens_details"] == {"cached_tokens": 24}


def test_tool_calls_and_logprobs_reach_the_client_streamed_and_whole() -> None:
    call = openai_front.OpenAiCall(chat=True, model="m", stream=True, include_usage=False, remaining_s=None)
    writer = openai_front.ChunkWriter(call, "abc", created=1)
    opening = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "weather", "arguments": '{"ci'}}]}
    rest = {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}
    chunk = orjson.loads(writer.delta(TextDelta("", "", opening))[6:])["choices"][0]
    assert chunk["delta"] == {"role": "assistant", **opening}  # no content: it only calls a tool
    merged = merge_fields(opening, rest)
    whole = openai_front.completion_object(call, "abc", "", "tool_calls", None, None, merged,
                                           {"content": [{"token": "a", "logprob": -0.1}]})
    message = whole["choices"][0]["message"]
    assert message["content"] is None and whole["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    assert whole["choices"][0]["logprobs"] == {"content": [{"token": "a", "logprob": -0.1}]}
    text_call = openai_front.OpenAiCall(chat=False, model="m", stream=True, include_usage=False, remaining_s=None)
    logprobs = {"tokens": ["a"], "token_logprobs": [-0.1]}
    text_chunk = orjson.loads(openai_front.ChunkWriter(text_call, "abc").delta(TextDelta("a", "", None, logprobs))[6:])
    assert text_chunk["choices"][0]["logprobs"] == logprobs


def test_a_deferred_completion_refuses_what_its_stored_text_cannot_carry() -> None:
    deferred = http_api.deferred_request({**BASE, "deadline": 0, "presence_penalty": 0.3, "logprobs": False}, {})
    assert orjson.loads(deferred.request.engine_fields_json) == {"presence_penalty": 0.3}
    with pytest.raises(InvalidRequest) as refused:
        http_api.deferred_request({**BASE, "logprobs": 2}, {})
    assert [v.field for v in refused.value.violations] == ["logprobs"]
