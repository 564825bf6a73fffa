"""Server-sent events as OpenAI-compatible servers stream them: ``data: {json}\\n\\n`` ... ``data: [DONE]``.

``SseParser.feed`` takes whatever one network read returned and gives back the complete
events in it, so the dispatcher can relay everything that arrived together as one chunk
(coalescing without waiting for more).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
