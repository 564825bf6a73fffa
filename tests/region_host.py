"""A region without Ray: the real ``RegionGateway`` (the class Ray Serve runs as a region's
ingress, with its tickets, receipts, outbox and live-state publisher) hosted in a plain
uvicorn server, over stub engines that stand in for the vLLM replicas and count their own work.

What is simulated is only what the gateway reaches through Ray: each pool's engine
(``StubEngine``, called in-process through ``LocalHandle``, the part of a Serve
``DeploymentHandle`` the gateway uses). A stub engine answers as ``RegionLLMServer`` does:
SSE strings as vLLM streams them (the usage so far in every chunk when the gateway asks for
``continuous_usage_stats``; the usage chunk, then ``[DONE]``), ``live_stats`` and
``prompt_tokens``. Its tokenizer counts a token per 3 bytes of prompt (a router's estimate is
one per 4: a bill on the router's count would fall short of the engine's). It writes what it
did to a tally file, one JSON line per step (``EngineTally``): the prompt tokens prefilled
when a request starts and each token generated as it hands it over; a restart of the host
keeps the file.

``python -m tests.region_host --region eu-north --port 0 --state redis://... --namespace NS
--tally FILE`` prints ``PORT <n>`` once listening; the ticket keys come from
``$SCHEDULER_TICKET_KEYS_FILE``. SIGTERM stops it: streams still open get ``--grace-s``, then
they are cut (their partial receipts written), then the gateway's outbox is flushed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BYTES_PER_TOKEN = 3
WORDS = ("grid", "carbon", "joule", "watt", "region", "pool", "token", "ledger")
TAG = "[rid="  # prompts that carry "[rid=<request id>]" are tallied under that id


def prompt_tokens_of(body: dict[str, Any]) -> int:
    """The stub engine's tokenizer (and chat template: 4 tokens per message)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(math.ceil(len(str(m.get("content", "")).encode()) / BYTES_PER_TOKEN) + 4 for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    return max(1, math.ceil(len(str(prompt or "").encode()) / BYTES_PER_TOKEN))


def request_tag(body: dict[str, Any]) -> str:
    """The request id a test wrote into the prompt (``[rid=...]``), else the whole prompt."""
    messages = body.get("messages")
    text = " ".join(str(m.get("content", "")) for m in messages) if isinstance(messages, list) \
        else str(body.get("prompt", ""))
    start = text.find(TAG)
    return text[start + len(TAG): text.index("]", start)] if start >= 0 else text


@dataclass(frozen=True)
class EngineTally:
    """What the engines of one host did, appended to ``path`` (None: kept nowhere) a line at a
    time, so that a process stopped any way leaves every step it took in the file."""

    region: str
    path: Path | None

    def record(self, pool: str, tag: str, prompt_tokens: int, completion_tokens: int) -> None:
        if self.path is None:
            return
        with self.path.open("a") as out:
            out.write(json.dumps({"region": self.region, "pool": pool, "tag": tag,
                                  "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}) + "\n")


def read_tallies(paths: list[Path]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(region, pool, tag) -> (prompt tokens prefilled, tokens generated), from tally files."""
    done: dict[tuple[str, str, str], tuple[int, int]] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            step = json.loads(line)
            key = (step["region"], step["pool"], step["tag"])
            before = done.get(key, (0, 0))
            done[key] = (max(before[0], step["prompt_tokens"]), max(before[1], step["completion_tokens"]))
    return done


@dataclass
class StubEngine:
    """One pool's engine (see the module docstring)."""

    pool: str
    tally: EngineTally
    prefill_s: float = 0.0
    token_interval_s: float = 0.0
    # Set: every stream raises this after that many tokens (an engine that dies mid-stream).
    fail_after: int | None = None
    # Set: ``prompt_tokens`` raises (an engine that cannot answer).
    count_fails: bool = False
    running: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0

    async def stream_completions(self, body: dict[str, Any], prefix_key: str | None = None,
                                 ) -> AsyncIterator[list[str | dict[str, Any]]]:
        async for batch in self._stream(body, chat=False):
            yield batch

    async def stream_chat(self, body: dict[str, Any], prefix_key: str | None = None,
                          ) -> AsyncIterator[list[str | dict[str, Any]]]:
        async for batch in self._stream(body, chat=True):
            yield batch

    async def _stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[list[str | dict[str, Any]]]:
        max_tokens = int(body["max_tokens"])
        options = body.get("stream_options") or {}
        continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
        prompt, tag = prompt_tokens_of(body), request_tag(body)
        head = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model", "")}
        self.running += 1
        try:
            self.prompt_tokens_total += prompt
            self.tally.record(self.pool, tag, prompt, 0)
            await asyncio.sleep(self.prefill_s)
            for i in range(max_tokens):
                if i:
                    await asyncio.sleep(self.token_interval_s)
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError(f"engine of pool {self.pool} died")
                word = WORDS[i % len(WORDS)] + " "
                finish = "length" if i == max_tokens - 1 else None
                choice = ({"index": 0, "delta": {"content": word}, "finish_reason": finish} if chat
                          else {"index": 0, "text": word, "logprobs": None, "finish_reason": finish})
                usage = {"prompt_tokens": prompt, "completion_tokens": i + 1, "total_tokens": prompt + i + 1} \
                    if continuous else None
                self.generation_tokens_total += 1
                self.tally.record(self.pool, tag, prompt, i + 1)
                yield [_sse({**head, "choices": [choice], "usage": usage})]
            final = {"prompt_tokens": prompt, "completion_tokens": max_tokens, "total_tokens": prompt + max_tokens,
                     "prompt_tokens_details": {"cached_tokens": 0}}
            yield [_sse({**head, "choices": [], "usage": final}), "data: [DONE]\n\n"]
        finally:
            self.running -= 1

    async def live_stats(self) -> dict[str, float]:
        return {"running": float(self.running), "waiting": 0.0, "kv_cache_usage": 0.1,
                "prefix_cache_hit_rate": 0.0, "prompt_tokens_total": float(self.prompt_tokens_total),
                "generation_tokens_total": float(self.generation_tokens_total), "max_model_len": 32768.0}

    async def prompt_tokens(self, body: dict[str, Any], method: str) -> int:
        if self.count_fails:
            raise RuntimeError(f"engine of pool {self.pool} is gone")
        return prompt_tokens_of(body)


def _sse(payload: dict[str, Any]) -> str:
    return "data: " + json.dumps(payload, separators=(",", ":")) + "\n\n"


class LocalHandle:
    """What the gateway uses of a Serve ``DeploymentHandle``, calling ``engine`` in-process:
    ``handle.options(stream=True).stream_chat.remote(...)`` is the engine's async generator,
    ``handle.live_stats.remote()`` its coroutine."""

    def __init__(self, engine: StubEngine) -> None:
        self._engine = engine

    def options(self, stream: bool = False) -> LocalHandle:
        return self

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self._engine, name))


@dataclass(frozen=True)
class _Remote:
    call: Callable[..., Any]

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


def gateway_class() -> type:
    """``RegionGateway`` as written (Serve's decorator undone), stopped by ``stop()`` rather
    than by the garbage collector (its ``__del__`` is a coroutine Serve awaits)."""
    from scheduler.region.gateway import RegionGateway

    base: type = RegionGateway.func_or_class

    class HostedGateway(base):  # type: ignore[misc, valid-type]
        async def stop(self) -> None:
            await base.__del__(self)

        def __del__(self) -> None:
            pass

    return HostedGateway


async def start_gateway(region_name: str, engines: dict[str, StubEngine], store_url: str | None,
                        namespace: str, ticket_keys: Any = None, **settings: Any) -> Any:
    """A started gateway for the shipped region ``region_name``, one stub engine per pool;
    ``settings``: other ``GatewaySettings`` fields."""
    from scheduler.config.loader import load_fleet
    from scheduler.region.gateway import GatewaySettings, PoolEngine

    region = next(r for r in load_fleet().regions if r.name == region_name)
    settings = GatewaySettings(region=region, pools={name: (PoolEngine("stub-engine", 32768),) for name in engines},
                               store_url=store_url, namespace=namespace, publish_interval_s=0.5,
                               ticket_keys=ticket_keys, **settings)
    cls = gateway_class()
    gateway = cls.__new__(cls)
    await gateway.__init__({name: {"stub-engine": LocalHandle(engine)} for name, engine in engines.items()}, settings)
    return gateway


def asgi(gateway: Any) -> Callable[..., Any]:
    """The gateway as an ASGI app (what Serve's proxy does for it). The server's shutdown stops
    it, as Serve calls a replica's ``__del__``: after the streams still open were cut, before
    the process exits (uvicorn re-raises the stopping signal once ``serve`` returns)."""
    from starlette.requests import Request

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await gateway.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        response = await gateway(Request(scope, receive))
        await response(scope, receive, send)

    return app


def http_server(gateway: Any, grace_s: float = 1.0) -> Any:
    """A uvicorn server for the gateway; a stop gives open streams ``grace_s``, then cuts them."""
    import uvicorn

    config = uvicorn.Config(asgi(gateway), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=grace_s)
    return uvicorn.Server(config)


@dataclass
class InProcessRegion:
    """The hosted gateway served on the current event loop, on port 0 (tests that read its
    engines or call it directly): ``async with InProcessRegion(gateway) as region``."""

    gateway: Any
    port: int = 0
    _server: Any = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> InProcessRegion:
        from scheduler.server.stub_region import bind

        sock = bind(port=self.port)
        self.port = sock.getsockname()[1]
        self._server = http_server(self.gateway)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True  # its shutdown stops the gateway
            await asyncio.wait_for(self._task, 10)


async def serve(args: argparse.Namespace) -> None:
    from scheduler.config.loader import load_fleet
    from scheduler.server.stub_region import bind

    region = next(r for r in load_fleet().regions if r.name == args.region)
    tally = EngineTally(args.region, args.tally)
    engines = {p.name: StubEngine(p.name, tally, args.prefill_ms / 1000, args.token_interval_ms / 1000)
               for p in region.pools}
    gateway = await start_gateway(args.region, engines, args.state, args.namespace)
    sock = bind(port=args.port)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await http_server(gateway, args.grace_s).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a region's real gateway over stub engines, without Ray")
    parser.add_argument("--region", required=True, help="a shipped region (regions/)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state", required=True, help="redis://HOST:PORT/DB")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--tally", type=Path, default=None, help="file the engines append their work to")
    parser.add_argument("--prefill-ms", type=float, default=30.0)
    parser.add_argument("--token-interval-ms", type=float, default=20.0)
    parser.add_argument("--grace-s", type=float, default=1.0, help="what open streams get at a stop before they are cut")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
