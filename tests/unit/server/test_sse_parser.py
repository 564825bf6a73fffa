"""SSE framing as OpenAI-compatible servers send it."""

from __future__ import annotations

import pytest

from scheduler.sse_parser import SseParser


@pytest.mark.parametrize("reads, events", [
    ([b'data: {"a":1}\n\n'], ['{"a":1}']),
    ([b'data: {"a":1}\n\ndata: [DONE]\n\n'], ['{"a":1}', "[DONE]"]),
    ([b'data: {"a"', b':1}\n', b'\n'], ['{"a":1}']),  # split anywhere
    ([b'data: x\r\n\r\ndata: y\r', b'\n\r\n'], ["x", "y"]),  # CRLF, split inside one
    ([b': keep-alive\n\ndata: z\n\n'], ["z"]),  # comments carry no data
    ([b'event: message\ndata: line1\ndata: line2\n\n'], ["line1\nline2"]),
    ([b'data:nospace\n\n'], ["nospace"]),
], ids=["one", "two", "split", "crlf", "comment", "multiline", "nospace"])
def test_events(reads: list[bytes], events: list[str]) -> None:
    parser = SseParser()
    got = [event for data in reads for event in parser.feed(data)]
    assert got == events
    assert not parser.pending


def test_incomplete_event_is_held() -> None:
    parser = SseParser()
    assert parser.feed(b"data: part") == []
    assert parser.pending
