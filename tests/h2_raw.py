"""A minimal HTTP/2 client speaking gRPC's framing, for what real gRPC clients will not do: send
a message without waiting to be authenticated, count the bytes the server's flow control lets
through, and never read (or never finish the handshake).

It sends frames as RFC 9113 says (the preface, SETTINGS, HEADERS with literal HPACK fields, DATA
within the server's windows) and reads the server's frames without decoding their headers: a
stream ends on END_STREAM or RST_STREAM. Bytes it receives are never acknowledged with a
WINDOW_UPDATE, so a stream stalls once the window it announced (``initial_window``) is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x3, 0x4, 0x5
DEFAULT_WINDOW = 65_535


def _integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer with an N-bit prefix (RFC 7541 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name, no Huffman coding (RFC 7541 6.2.2)."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _integer(len(raw_name), 7) + raw_name + _integer(len(raw_value), 7) + raw_value


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


@dataclass
class Stream:
    window: int
    received: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reset: bool = False


@dataclass
class RawH2:
    """One connection; ``call`` opens a gRPC call on it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    # What the server said in its SETTINGS (MAX_CONCURRENT_STREAMS etc.).
    server_settings: dict[int, int] = field(default_factory=dict)
    streams: dict[int, Stream] = field(default_factory=dict)
    connection_window: int = DEFAULT_WINDOW
    goaway: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _window_opened: asyncio.Event = field(default_factory=asyncio.Event)
    _next_stream: int = 1
    _reading: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, host: str, port: int, initial_window: int = DEFAULT_WINDOW,
                      local_host: str | None = None) -> RawH2:
        """Connect, send the preface and SETTINGS (announcing ``initial_window`` per stream)."""
        local = None if local_host is None else (local_host, 0)
        reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        connection = cls(reader, writer)
        settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, initial_window)
        writer.write(PREFACE + _frame(SETTINGS, 0, 0, settings))
        connection._reading = asyncio.create_task(connection._read())
        return connection

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream_id = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await self.reader.readexactly(length)
                self._on_frame(kind, flags, stream_id, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            for stream in self.streams.values():
                stream.ended.set()
            self._window_opened.set()

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if kind == SETTINGS and not flags & ACK:
            for offset in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[offset:offset + 6])
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.server_settings.get(key, DEFAULT_WINDOW)
                    for open_stream in self.streams.values():
                        open_stream.window += delta
                self.server_settings[key] = value
            self.writer.write(_frame(SETTINGS, ACK, 0))
            self._window_opened.set()
        elif kind == PING and not flags & ACK:
            self.writer.write(_frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.connection_window += increment
            elif stream is not None:
                stream.window += increment
            self._window_opened.set()
        elif kind == DATA and stream is not None:
            stream.received += len(payload)
            if flags & END_STREAM:
                self._end(stream)
        elif kind == HEADERS and stream is not None and flags & END_STREAM:
            self._end(stream)
        elif kind == RST_STREAM and stream is not None:
            stream.reset = True
            self._end(stream)
        elif kind == GOAWAY:
            self.goaway = True

    def _end(self, stream: Stream) -> None:
        stream.ended.set()
        self._window_opened.set()  # a sender waiting for window room stops

    async def call(self, path: str, message: bytes, metadata: dict[str, str] | None = None,
                   send_for_s: float = 5.0) -> tuple[int, Stream]:
        """Open a gRPC call to ``path`` and send ``message`` in one length-prefixed frame as far
        as the server's flow control lets it within ``send_for_s`` (or until the server ends
        the stream); the bytes of the message sent and the stream."""
        stream_id = self._next_stream
        self._next_stream += 2
        stream = self.streams[stream_id] = Stream(self.server_settings.get(SETTINGS_INITIAL_WINDOW_SIZE,
                                                                           DEFAULT_WINDOW))
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "router"),
                  ("content-type", "application/grpc"), ("te", "trailers"), *(metadata or {}).items()]
        self.writer.write(_frame(HEADERS, END_HEADERS, stream_id, b"".join(_literal(n, v) for n, v in fields)))
        # The gRPC message prefix (not compressed, the length), then the message, never copied whole.
        prefix = b"\x00" + struct.pack(">I", len(message))
        view = memoryview(message)
        total = len(prefix) + len(message)
        sent = 0
        loop = asyncio.get_running_loop()
        until = loop.time() + send_for_s
        max_frame = self.server_settings.get(SETTINGS_MAX_FRAME_SIZE, 16_384)
        while sent < total and not stream.ended.is_set() and loop.time() < until:
            room = min(self.connection_window, stream.window, max_frame, total - sent)
            if room <= 0:
                self._window_opened.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._window_opened.wait(), max(0.0, until - loop.time()))
                continue
            payload = (prefix + view[:room - len(prefix)] if sent == 0 else
                       bytes(view[sent - len(prefix):sent - len(prefix) + room]))
            last = sent + room == total
            self.writer.write(_frame(DATA, END_STREAM if last else 0, stream_id, payload))
            self.connection_window -= room
            stream.window -= room
            sent += room
            await self.writer.drain()
        return max(0, sent - len(prefix)), stream

    def close(self) -> None:
        self.writer.close()
        if self._reading is not None:
            self._reading.cancel()
