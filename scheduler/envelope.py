"""The Connect protocol's envelopes (connectrpc.com/docs/protocol, "Streaming-RPC"): every
message of a streaming call travels as one flags byte, its length (4 bytes, big-endian) and
the message. Flag 0x02 marks the end-of-stream message, a JSON object with the call's error,
if any, and its trailers: ``{"error": {"code": "unavailable", "message": ..., "details": [...]}}``
or ``{}``. The router's HTTP front door streams ``Generate`` so, and the SDK reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MESSAGE = 0x00
COMPRESSED = 0x01
END_STREAM = 0x02
CONNECT_PROTO = "application/connect+proto"
_HEADER = 5


class EnvelopeError(ValueError):
    """Bytes that are not a well-formed envelope stream (or a message past the size limit)."""


def envelope(payload: bytes, flags: int = MESSAGE) -> bytes:
    return bytes((flags,)) + len(payload).to_bytes(4, "big") + payload


@dataclass
class EnvelopeReader:
    """Whole envelopes out of a byte stream that arrives in pieces of any size."""

    max_message_bytes: int
    _buffer: bytearray = field(default_factory=bytearray, init=False, repr=False)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """(flags, message) of every envelope ``data`` completes, in order."""
        buffer = self._buffer
        buffer += data
        out: list[tuple[int, bytes]] = []
        start = 0
        while len(buffer) - start >= _HEADER:
            flags = buffer[start]
            size = int.from_bytes(buffer[start + 1:start + _HEADER], "big")
            if size > self.max_message_bytes:
                raise EnvelopeError(f"a message of {size:,} bytes exceeds the limit of {self.max_message_bytes:,}")
            if flags & ~(COMPRESSED | END_STREAM):
                raise EnvelopeError(f"unknown envelope flags {flags:#04x}")
            end = start + _HEADER + size
            if end > len(buffer):
                break
            out.append((flags, bytes(buffer[start + _HEADER:end])))
            start = end
        del buffer[:start]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete envelope held (not 0 at the end: the stream was cut)."""
        return len(self._buffer)
