"""Server-sent events as OpenAI-compatible servers stream them: ``data: {json}\\n\\n`` ... ``data: [DONE]``.

``SseParser.feed`` takes whatever one network read returned and gives back the complete
events in it, so the dispatcher can relay everything that arrived together as one chunk
(coalescing without waiting for more).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = "[DONE]"
DONE_BYTES = b"[DONE]"


@dataclass
class SseParser:
    _buffer: bytes = field(default=b"", init=False, repr=False)

    def feed_bytes(self, data: bytes) -> list[bytes]:
        """The ``data`` payloads of the events completed by ``data`` (one bytes object per event)."""
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *complete, self._buffer = buffer.split(b"\n\n")
        payloads = []
        for block in complete:
            if block.startswith(b"data: ") and b"\n" not in block:
                payloads.append(block[6:])  # the usual shape: one data line
                continue
            lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines))
        return payloads

    def feed(self, data: bytes) -> list[str]:
        """The ``data`` payloads of the events completed by ``data`` (one string per event)."""
        return [payload.decode("utf-8", errors="replace") for payload in self.feed_bytes(data)]

    @property
    def pending(self) -> bool:
        """True when an incomplete event is buffered."""
        return bool(self._buffer.strip())


class MalformedEvent(ValueError):
    """An event that is not a JSON object, or an OpenAI error event (the message says which)."""


def parse_event(payload: str | bytes) -> dict[str, Any]:
    """One event's JSON object; ``MalformedEvent`` for anything else or an error event."""
    try:
        event = orjson.loads(payload)
    except ValueError:
        raise MalformedEvent(f"malformed event: {payload[:80]!r}") from None
    if type(event) is not dict:
        raise MalformedEvent(f"malformed event: {payload[:80]!r}")
    if "error" in event:
        message, _ = openai_error(orjson.dumps(event))
        raise MalformedEvent(f"error event: {message}")
    return event


def choice_text(event: dict[str, Any]) -> tuple[str, str]:
    """(text, finish_reason) of a completion or chat chunk's first choice ("" when none)."""
    choices = event.get("choices")
    if not choices or type(choices) is not list or type(choice := choices[0]) is not dict:
        return "", ""
    delta = choice.get("delta")
    text = (delta.get("content") if type(delta) is dict else choice.get("text")) or ""
    reason = choice.get("finish_reason") or ""
    return text if type(text) is str else str(text), reason if type(reason) is str else str(reason)


def openai_error(raw: bytes) -> tuple[str, str]:
    """(message, param) from an OpenAI error body, or the raw text."""
    try:
        body = json.loads(raw)
        error = body["error"]
        return str(error.get("message", "")), str(error.get("param") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return raw[:200].decode("utf-8", errors="replace"), ""
