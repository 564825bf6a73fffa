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


@dataclass
class SseParser:
    _buffer: bytes = field(default=b"", init=False, repr=False)

    def feed(self, data: bytes) -> list[str]:
        """The ``data`` payloads of the events completed by ``data`` (one string per event)."""
        self._buffer = (self._buffer + data).replace(b"\r\n", b"\n")
        *complete, self._buffer = self._buffer.split(b"\n\n")
        payloads = []
        for block in complete:
            lines = [
                line[5:].removeprefix(b" ")
                for line in block.split(b"\n")
                if line.startswith(b"data:")
            ]
            if lines:
                payloads.append(b"\n".join(lines).decode("utf-8", errors="replace"))
        return payloads

    @property
    def pending(self) -> bool:
        """True when an incomplete event is buffered."""
        return bool(self._buffer.strip())


class MalformedEvent(ValueError):
    """An event that is not a JSON object, or an OpenAI error event (the message says which)."""


def parse_event(payload: str) -> dict[str, Any]:
    """One event's JSON object; ``MalformedEvent`` for anything else or an error event."""
    try:
        event = orjson.loads(payload)
    except ValueError:
        raise MalformedEvent(f"malformed event: {payload[:80]!r}") from None
    if not isinstance(event, dict):
        raise MalformedEvent(f"malformed event: {payload[:80]!r}")
    if "error" in event:
        message, _ = openai_error(orjson.dumps(event))
        raise MalformedEvent(f"error event: {message}")
    return event


def choice_text(event: dict[str, Any]) -> tuple[str, str]:
    """(text, finish_reason) of a completion or chat chunk's first choice ("" when none)."""
    choices = event.get("choices") or []
    if not choices:
        return "", ""
    choice = choices[0]
    delta = choice.get("delta")
    text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
    return str(text), str(choice.get("finish_reason") or "")


def openai_error(raw: bytes) -> tuple[str, str]:
    """(message, param) from an OpenAI error body, or the raw text."""
    try:
        body = json.loads(raw)
        error = body["error"]
        return str(error.get("message", "")), str(error.get("param") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return raw[:200].decode("utf-8", errors="replace"), ""
