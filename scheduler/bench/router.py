"""``scheduler bench router``: the time to first token the router adds over calling the region.

Starts a stub region (``scheduler.server.stub_region``) and a router (``scheduler router``,
memory state, one region pointing at the stub) as separate processes, then streams the
same completion ``--requests`` times per path with ``--concurrency`` streams in flight:
directly to the region over HTTP/SSE, and through the router over gRPC. TTFT is measured
by the client, from sending to the first text. The two paths alternate in rounds so that
drift on a shared machine hits both. Prints p50/p99 per path and the difference.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import yaml

from scheduler.plugins import load_checked_fleet
from scheduler.server.sse import DONE, SseParser

BENCH_REGION = "eu-north"
BENCH_MODEL = "llama-3.1-8b"
PROMPT = "Summarise the energy cost of serving one language-model request in a sentence."
ROUNDS = 4
WARMUP = 64


def _spawn(command: list[str], ready: re.Pattern[str], timeout_s: float = 60.0) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        match = ready.search(line)
        if match:
            return process, int(match.group(1))
    process.terminate()
    raise RuntimeError(f"{' '.join(command)} did not report its port")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _direct_ttft(client: httpx.AsyncClient, url: str, max_tokens: int) -> float:
    body = {"model": BENCH_MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    parser = SseParser()
    first = None
    start = time.perf_counter()
    async with client.stream("POST", url, json=body) as response:
        async for data in response.aiter_bytes():
            for payload in parser.feed(data):
                if first is None and payload != DONE:
                    choices = json.loads(payload).get("choices") or []
                    if choices and choices[0].get("text"):
                        first = time.perf_counter()
    if first is None:
        raise RuntimeError("the region streamed no text")
    return first - start


async def _router_ttft(stub: object, request: object) -> float:
    first = None
    start = time.perf_counter()
    async for event in stub.Generate(request):  # type: ignore[attr-defined]
        if first is None and event.WhichOneof("event") == "chunk":
            first = time.perf_counter()
    if first is None:
        raise RuntimeError("the router streamed no text")
    return first - start


async def _run(one: Callable[[], Awaitable[float]], count: int, concurrency: int, progress: object) -> list[float]:
    semaphore = asyncio.Semaphore(concurrency)
    results: list[float] = []

    async def task() -> None:
        async with semaphore:
            results.append(await one())
            progress.update(1)  # type: ignore[attr-defined]

    await asyncio.gather(*(task() for _ in range(count)))
    return results


async def _measure(region_port: int, router_port: int, requests: int, concurrency: int,
                   max_tokens: int) -> tuple[list[float], list[float]]:
    import grpc
    from tqdm import tqdm

    from scheduler.client.common import build_request
    from scheduler.v1 import router_pb2_grpc

    url = f"http://127.0.0.1:{region_port}/v1/completions"
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    request = build_request(prompt=PROMPT, model=BENCH_MODEL, max_tokens=max_tokens)
    direct: list[float] = []
    routed: list[float] = []
    async with (
        httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False) as client,
        grpc.aio.insecure_channel(f"127.0.0.1:{router_port}") as channel,
    ):
        stub = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]
        with tqdm(total=2 * (requests + WARMUP), desc="streams", unit="stream") as progress:
            await _run(lambda: _direct_ttft(client, url, max_tokens), WARMUP, concurrency, progress)
            await _run(lambda: _router_ttft(stub, request), WARMUP, concurrency, progress)
            per_round = max(1, requests // ROUNDS)
            for _ in range(ROUNDS):
                direct += await _run(lambda: _direct_ttft(client, url, max_tokens), per_round, concurrency, progress)
                routed += await _run(lambda: _router_ttft(stub, request), per_round, concurrency, progress)
    return direct, routed


def run_router_bench(requests: int, concurrency: int, max_tokens: int, first_token_delay_ms: float) -> int:
    fleet = load_checked_fleet()
    region_proc, region_port = _spawn(
        [sys.executable, "-m", "scheduler.server.stub_region", "--port", "0",
         "--first-token-delay-ms", str(first_token_delay_ms)],
        re.compile(r"PORT (\d+)"),
    )
    router_proc = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            region = next(r for r in fleet.regions if r.name == BENCH_REGION)
            raw = region.model_copy(update={"endpoint": f"http://127.0.0.1:{region_port}"}).model_dump(mode="json")
            (Path(tmp) / f"{BENCH_REGION}.yaml").write_text(yaml.safe_dump(raw))
            router_proc, router_port = _spawn(
                [sys.executable, "-m", "scheduler.cli", "router", "--host", "127.0.0.1", "--port", "0",
                 "--regions", tmp, "--state", "memory", "--rate-limit", "1000000"],
                re.compile(r"router listening on [^:]+:(\d+)"),
            )
            direct, routed = asyncio.run(_measure(region_port, router_port, requests, concurrency, max_tokens))
    finally:
        if router_proc is not None:
            _stop(router_proc)
        _stop(region_proc)

    load = os.getloadavg()[0]
    print(f"\nrouter bench: {len(direct)} streams per path, {concurrency} concurrent, max_tokens {max_tokens}, "
          f"stub region first-token delay {first_token_delay_ms:g} ms; {os.cpu_count()} CPUs, load {load:.1f}")
    print(f"{'TTFT (ms)':<24}{'p50':>10}{'p99':>10}")
    rows = {"direct to the region": direct, "through the router": routed}
    for name, values in rows.items():
        print(f"{name:<24}{_percentile(values, 0.5) * 1e3:>10.2f}{_percentile(values, 0.99) * 1e3:>10.2f}")
    added50 = (_percentile(routed, 0.5) - _percentile(direct, 0.5)) * 1e3
    added99 = (_percentile(routed, 0.99) - _percentile(direct, 0.99)) * 1e3
    print(f"{'added by the router':<24}{added50:>10.2f}{added99:>10.2f}   (goal: p50 < 1 ms, p99 < 5 ms)")
    return 0
