"""The dispatcher reads a region's SSE events: its one-step path for a completion chunk's text
gives what the general path gives, for every shape an OpenAI-compatible server may send."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scheduler.server.dispatch import DispatchSettings, RegionStream, _RegionFailed, merge_fields
from scheduler.sse_parser import SseParser

CHUNK = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "text": "lorem ", "logprobs": None, "finish_reason": None, "stop_reason": None}],
         "usage": None}
PAYLOADS: list[Any] = [
    CHUNK,
    {**CHUNK, "choices": [{**CHUNK["choices"][0], "finish_reason": "length"}]},
    {**CHUNK, "choices": [{**CHUNK["choices"][0], "text": ""}]},
    {**CHUNK, "choices": [{**CHUNK["choices"][0], "text": 7}]},  # a number as text: str() on the general path
    {**CHUNK, "choices": [{**CHUNK["choices"][0], "finish_reason": 3}]},
    {**CHUNK, "choices": []},
    {**CHUNK, "choices": ["x"]},
    {**CHUNK, "choices": "x"},
    {k: v for k, v in CHUNK.items() if k != "usage"},
    {**CHUNK, "usage": {"prompt_tokens": 3, "completion_tokens": 1, "energy": {"energy_j": 1.5}}},
    {**CHUNK, "usage": 5},
    {**CHUNK, "energy": {"energy_j": 2.0}},  # energy outside usage: ignored on both paths
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "hi"}, "text": "no", "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 16}},
    {**CHUNK, "choices": [{**CHUNK["choices"][0], "logprobs": {"tokens": ["lorem "], "token_logprobs": [-0.5]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
]


def stream() -> RegionStream:
    return RegionStream(decision=None, call=None, client=None, settings=DispatchSettings(),  # type: ignore[arg-type]
                        deadline_s=None, x_scheduler={})


@pytest.mark.parametrize("event", PAYLOADS)
def test_the_one_step_path_reads_what_the_general_path_reads(event: Any) -> None:
    payload = orjson.dumps(event)
    fast, general = stream(), stream()
    assert fast._event(payload) == general._general_event(payload)
    assert (fast.usage, fast.energy) == (general.usage, general.energy)
    assert (fast._delta_fields, fast._logprobs) == (general._delta_fields, general._logprobs)


def test_what_a_choice_carries_beside_text_is_kept_merged_and_counted() -> None:
    region = stream()
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}],
                                            "reasoning_content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok", "tool_calls": []},
                      "logprobs": {"content": [{"token": "ok", "logprob": -0.1}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    texts: list[str] = []
    data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    finish, done = region._take(SseParser(), data, texts)
    assert (texts, finish, done) == (["ok"], "tool_calls", False)
    assert region.content_events == 3  # the two tool-call deltas and the text
    assert region._delta_fields == {"tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city"'}}]}
    assert region._logprobs == {"content": [{"token": "ok", "logprob": -0.1}]}


def test_merge_joins_text_and_lists_and_keeps_the_later_scalar() -> None:
    merged = merge_fields({"reasoning_content": "be", "logprobs": {"tokens": ["a"], "n": 1}},
                          {"reasoning_content": "cause", "logprobs": {"tokens": ["b"], "n": 2}, "x": 1})
    assert merged == {"reasoning_content": "because", "logprobs": {"tokens": ["a", "b"], "n": 2}, "x": 1}


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"text"',
                                     b'{"error": {"message": "engine dead", "type": "server_error"}}'])
def test_malformed_and_error_events_fail_the_region(payload: bytes) -> None:
    with pytest.raises(_RegionFailed):
        stream()._event(payload)
