"""The dispatcher reads a region's SSE events: its one-step path for a completion chunk's text
gives what the general path gives, for every shape an OpenAI-compatible server may send."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scheduler.server.dispatch import DispatchSettings, RegionStream, _RegionFailed

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


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"text"',
                                     b'{"error": {"message": "engine dead", "type": "server_error"}}'])
def test_malformed_and_error_events_fail_the_region(payload: bytes) -> None:
    with pytest.raises(_RegionFailed):
        stream()._event(payload)
