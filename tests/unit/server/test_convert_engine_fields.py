"""A GenerateRequest's engine fields (``engine_fields_json``) and OpenAI's other message fields
reach the region's body, which a region's gateway accepts (``tickets.engine_body``) and a
ticket's digest binds; a field the engine is not given is refused by name."""

from __future__ import annotations

import orjson
import pytest

from scheduler import errors, tickets
from scheduler.client import direct
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.server import convert
from scheduler.types import FleetSnapshot
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

pytestmark = pytest.mark.timeout(60)

NOW = 1_780_000_000.0
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "x" * 4000,
                                           "parameters": {"type": "object", "properties": {}}}}]


def snapshot() -> FleetSnapshot:
    fleet = load_fleet()
    return SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default"))).build(NOW)


def chat(*messages: pb.ChatMessage, engine: dict[str, object] | None = None) -> pb.GenerateRequest:
    msg = pb.GenerateRequest(model="llama-3.1-8b", sampling=pb.SamplingParams(max_tokens=8))
    msg.chat.messages.extend(messages or [pb.ChatMessage(role="user", content="Weather in Paris?")])
    if engine is not None:
        msg.engine_fields_json = orjson.dumps(engine).decode()
    return msg


def test_engine_fields_and_tool_messages_reach_the_body_the_gateway_accepts() -> None:
    plain = convert.incoming(chat(), "acme", snapshot())
    calls = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]
    incoming = convert.incoming(chat(
        pb.ChatMessage(role="user", content="Weather in Paris?", name="ann"),
        pb.ChatMessage(role="assistant", tool_calls_json=orjson.dumps(calls).decode()),
        pb.ChatMessage(role="tool", content="12 C", tool_call_id="call_1"),
        engine={"tools": TOOLS, "tool_choice": "auto", "response_format": {"type": "json_object"}, "top_k": 5},
    ), "acme", snapshot())
    body = incoming.call.body
    assert body["messages"] == [{"role": "user", "content": "Weather in Paris?", "name": "ann"},
                                {"role": "assistant", "content": None, "tool_calls": calls},
                                {"role": "tool", "content": "12 C", "tool_call_id": "call_1"}]
    assert (body["tools"], body["tool_choice"], body["top_k"]) == (TOOLS, "auto", 5)
    # The tool definitions are rendered into the prompt: they count in its estimate.
    assert incoming.request.prompt_tokens > plain.request.prompt_tokens + 1000
    sent = {**body, "model": "llama-3.1-8b", "stream": True, "stream_options": {"include_usage": True}}
    assert tickets.engine_body(sent) == sent
    bound = tickets.body_digest(sent)
    assert bound is not None
    changed = tickets.body_digest({**sent, "tool_choice": "none"})
    assert changed is not None and changed[0] != bound[0]  # the ticket binds the engine fields


@pytest.mark.parametrize("engine_json, field", [
    ('{"temperature": 0.5}', "engine_fields_json.temperature"),  # a field of its own
    ('{"x_scheduler": {}}', "engine_fields_json.x_scheduler"),
    ('{"guided_grammar": "x"}', "engine_fields_json.guided_grammar"),
    ("[1]", "engine_fields_json"),
    ("{nope", "engine_fields_json"),
    ("{" + '"a": 1,' * (convert.MAX_ENGINE_FIELDS_BYTES // 7) + '"b": 1}', "engine_fields_json"),
])
def test_engine_fields_outside_the_allowlist_are_refused_by_name(engine_json: str, field: str) -> None:
    msg = chat()
    msg.engine_fields_json = engine_json
    with pytest.raises(errors.InvalidRequest) as refused:
        convert.incoming(msg, "acme", snapshot())
    assert [v.field for v in refused.value.violations] == [field]


def test_tool_calls_that_are_not_a_json_list_are_refused() -> None:
    with pytest.raises(errors.InvalidRequest) as refused:
        convert.incoming(chat(pb.ChatMessage(role="assistant", tool_calls_json='{"id": 1}')), "acme", snapshot())
    assert [v.field for v in refused.value.violations] == ["chat.messages[0].tool_calls_json"]


def test_a_direct_mode_client_sends_the_body_the_router_signed() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]
    msg = chat(pb.ChatMessage(role="user", content="Weather in Paris?", name="ann"),
               pb.ChatMessage(role="assistant", tool_calls_json=orjson.dumps(calls).decode()),
               pb.ChatMessage(role="tool", content="12 C", tool_call_id="call_1"),
               engine={"tools": TOOLS, "logprobs": True, "top_logprobs": 2})
    signed = convert.incoming(msg, "acme", snapshot()).call.body
    target = router_pb2.DirectTarget(region="eu-north", pool="p", model="llama-3.1-8b")
    sent = direct.region_body(msg, target)
    assert tickets.body_digest(sent) == tickets.body_digest(signed)
    assert tickets.engine_body({k: v for k, v in sent.items() if k != "x_scheduler"})
