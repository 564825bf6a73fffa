"""A small OpenAI-compatible streaming server standing in for a region: the router benchmark's
baseline and the router's fast tests (the real region is ``scheduler.region``).

It follows OpenAI's documented streaming format: ``POST /v1/completions`` or
``/v1/chat/completions`` with ``"stream": true`` answers ``text/event-stream`` chunks
(``text_completion`` / ``chat.completion.chunk``), then a usage chunk with ``"choices": []``
(plus our ``energy`` extension when ``report_energy``), then ``data: [DONE]``. Bad requests
get a 400 with OpenAI's error body naming the ``param``. A chat request with ``tools`` (and a
``tool_choice`` other than ``"none"``) is answered with one call of the tool it names, else the
first, as an engine's tool parser streams it (``STUB_TOOL_ARGUMENTS`` in two parts, finish
reason ``tool_calls``); ``"logprobs": true`` adds each word's logprob (``STUB_LOGPROB``).

``python -m scheduler.server.stub_region --port 0`` prints ``PORT <n>`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

PROMPT_BYTES_PER_TOKEN = 4
STUB_TOOL_ARGUMENTS = ('{"city": ', '"Paris"}')
STUB_LOGPROB = -0.25


@dataclass
class StubRegionSettings:
    name: str = "stub"
    # Words streamed back, one per chunk, cycling, up to the request's max_tokens.
    words: tuple[str, ...] = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
    first_token_delay_s: float = 0.0
    token_interval_s: float = 0.0
    report_energy: bool = True
    energy_j_per_token: float = 0.5
    # Set: answer every request with this HTTP status (an unwell region).
    fail_status: int | None = None


@dataclass
class StubRegionLog:
    """What the stub received (tests read it): request bodies and their headers (names lower-cased),
    without changing them; ``headers[i]`` came with ``bodies[i]``."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def _error(status: int, message: str, param: str | None, code: str) -> Any:  # a starlette JSONResponse
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                   "param": param, "code": code}},
        status_code=status,
    )


def build_app(settings: StubRegionSettings, log: StubRegionLog | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> Any:
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body is not JSON", None, "invalid_json")
        if log is not None:
            log.bodies.append(body)
            log.headers.append(dict(request.headers))
        if settings.fail_status is not None:
            return _error(settings.fail_status, f"region {settings.name} is unwell", None, "unavailable")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            return _error(400, "max_tokens must be a positive integer", "max_tokens", "invalid_value")
        if body.get("stream") is not True:
            return _error(400, "this stub only streams", "stream", "invalid_value")
        messages = body.get("messages", [])
        text = "".join(str(m.get("content", "")) for m in messages) if chat else str(body.get("prompt", ""))
        prompt_tokens = max(1, len(text.encode()) // PROMPT_BYTES_PER_TOKEN)
        head = _head(str(body.get("model", "")), chat)
        tool = _called_tool(body) if chat else None
        stream = _tool_call_stream(settings, head, tool, prompt_tokens) if tool is not None else \
            _stream(settings, head, chat, max_tokens, prompt_tokens, body.get("logprobs") is True)
        return StreamingResponse(stream, media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response("ok")

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/health", health),
    ])


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _head(model: str, chat: bool) -> dict[str, Any]:
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model}


def _called_tool(body: dict[str, Any]) -> str | None:
    """The name of the tool a chat request's answer calls (None: it answers in text)."""
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        return str(choice.get("function", {}).get("name", ""))
    return str(tools[0].get("function", {}).get("name", ""))


async def _tool_call_stream(settings: StubRegionSettings, head: dict[str, Any], tool: str,
                            prompt_tokens: int) -> AsyncIterator[bytes]:
    yield _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_stub", "type": "function", "function": {"name": tool, "arguments": ""}}]},
        "finish_reason": None}]})
    for part in STUB_TOOL_ARGUMENTS:
        yield _event({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": part}}]}, "finish_reason": None}]})
    yield _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    yield _event(_usage_chunk(settings, head, prompt_tokens, len(STUB_TOOL_ARGUMENTS) + 1))
    yield b"data: [DONE]\n\n"


async def _stream(settings: StubRegionSettings, head: dict[str, Any], chat: bool, max_tokens: int,
                  prompt_tokens: int, logprobs: bool) -> AsyncIterator[bytes]:
    if settings.first_token_delay_s:
        await asyncio.sleep(settings.first_token_delay_s)
    if chat:
        yield _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}]})
    words = settings.words
    for i in range(max_tokens):
        if i and settings.token_interval_s:
            await asyncio.sleep(settings.token_interval_s)
        word = words[i % len(words)] + " "
        finish = "length" if i == max_tokens - 1 else None
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": word}, "finish_reason": finish} if chat
            else {"index": 0, "text": word, "logprobs": None, "finish_reason": finish}
        )
        if logprobs and chat:
            choice["logprobs"] = {"content": [{"token": word, "logprob": STUB_LOGPROB, "bytes": list(word.encode()),
                                               "top_logprobs": []}]}
        yield _event({**head, "choices": [choice]})
    yield _event(_usage_chunk(settings, head, prompt_tokens, max_tokens))
    yield b"data: [DONE]\n\n"


def _usage_chunk(settings: StubRegionSettings, head: dict[str, Any], prompt_tokens: int,
                 completion_tokens: int) -> dict[str, Any]:
    final: dict[str, Any] = {**head, "choices": [], "usage": {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}}
    if settings.report_energy:
        energy = settings.energy_j_per_token * (prompt_tokens * 0.1 + completion_tokens)
        final["energy"] = {
            "energy_j": energy, "energy_j_low": energy * 0.9, "energy_j_high": energy * 1.1,
            "measurement_source": "node-share", "confidence": 0.8, "attribution_method": "stub-v1",
            "phases": {"waiting_j": 0.0, "prefill_j": energy * 0.1, "decode_j": energy * 0.9,
                       "postprocess_j": 0.0, "idle_allocation_j": 0.0},
            "batch_size": 1.0, "avoided_j": 0.0,
        }
    return final


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    # proto=IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets of that proto, and
    # without it Nagle + delayed ACK hold the first body chunk for ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@dataclass
class StubRegion:
    """Runs the stub on the current event loop: ``async with StubRegion(settings) as region``;
    ``region.endpoint`` is its base URL; ``stop()`` kills it (open streams are cut, new
    connections refused)."""

    settings: StubRegionSettings = field(default_factory=StubRegionSettings)
    log: StubRegionLog = field(default_factory=StubRegionLog)
    port: int = 0
    _server: Any = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> StubRegion:
        import uvicorn

        sock = bind(port=self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self.settings, self.log), log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True
        # A stopped region is gone: cut open streams too (as a crash would), not only new calls.
        for connection in list(self._server.server_state.connections):
            connection.transport.abort()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server, self._task = None, None

    async def __aenter__(self) -> StubRegion:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="an OpenAI-compatible streaming stub region")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="stub")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--token-interval-ms", type=float, default=0.0)
    parser.add_argument("--word-bytes", type=int, default=0,
                        help="stream one word of this many bytes per token (0: the usual words): a stream "
                             "that fills its reader's buffers in a few tokens")
    args = parser.parse_args(argv)
    if args.word_bytes < 0:
        parser.error(f"--word-bytes: expected bytes >= 0, got {args.word_bytes}")
    import uvicorn

    settings = StubRegionSettings(name=args.name, first_token_delay_s=args.first_token_delay_ms / 1000,
                                  token_interval_s=args.token_interval_ms / 1000)
    if args.word_bytes:
        settings.words = ("x" * args.word_bytes + " ",)
    sock = bind(port=args.port)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(build_app(settings), log_level="warning", access_log=False, lifespan="off")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
