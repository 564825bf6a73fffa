"""``scheduler bench load``: many concurrent streams through one router process.

It starts what ``scheduler bench router`` starts (two stub backends, our router with ticket
keys and its HTTP front door), with backends that stream slowly (``--max-tokens`` tokens over
``--seconds``), then opens ``--streams`` streams at once (ramped over ``--ramp-s``) through the
router, by the SDK's gRPC proxy mode or the OpenAI front door, and holds them to their end.

It reports: streams completed and errors (by kind), the time to first token while all are
open (p50/p99), the router's CPU over the run (from /proc), and its resident memory idle, at
its peak and after, with the memory per open stream: (peak - idle) / streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.bench import router as bench
from scheduler.http.client import HttpClient

# The SDK's proxy mode over gRPC or over the HTTP front door (Connect), or the OpenAI front door.
PATHS = ("grpc", "http", "openai")


@dataclass
class LoadSettings:
    streams: int = 1000
    seconds: float = 60.0
    max_tokens: int = 60
    ramp_s: float = 10.0
    path: str = "grpc"
    json_path: Path | None = None


@dataclass
class LoadTally:
    started: int = 0
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ttfts: list[float] = field(default_factory=list)
    open_now: int = 0
    open_peak: int = 0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _one(settings: LoadSettings, tally: LoadTally, sdk: Any, http: HttpClient, url: str, body: bytes) -> None:
    tally.started += 1
    tally.open_now += 1
    tally.open_peak = max(tally.open_peak, tally.open_now)
    start = time.perf_counter()
    first = None
    try:
        if settings.path in ("grpc", "http"):
            generation = sdk.generate(bench.PROMPT, model=bench.BENCH_MODEL, max_tokens=settings.max_tokens,
                                      timeout_s=settings.seconds * 3, workload_class="batch")
            async for text in generation:
                if first is None and text:
                    first = time.perf_counter()
        else:
            async with http.stream("POST", url, body=body, headers={"content-type": "application/json"},
                                   read_timeout_s=settings.seconds) as reply:
                if reply.status != 200:
                    raise bench.StreamError(f"HTTP {reply.status}: {(await reply.read())[:120]!r}")
                async for data in reply.chunks():
                    if first is None and b'"text":"' in data and b'"text":""' not in data:
                        first = time.perf_counter()
                    if data.rstrip().endswith(b"}") and b"energy_receipt" in data:
                        break
        if first is None:
            raise bench.StreamError("no text")
        tally.ttfts.append(first - start)
        tally.completed += 1
    except Exception as exc:  # every failure is counted by its kind
        tally.errors[type(exc).__name__] += 1
    finally:
        tally.open_now -= 1


async def _drive(settings: LoadSettings, setup: bench.Setup) -> dict[str, Any]:
    from scheduler.client import AsyncSchedulerClient

    body = json.dumps({"model": bench.BENCH_MODEL, "prompt": bench.PROMPT, "max_tokens": settings.max_tokens,
                       "stream": True, "x_scheduler": {"workload_class": "batch"}}).encode()
    url = bench.completions_url(setup.router_http)
    tally = LoadTally()
    pid = setup.router_pid
    http = HttpClient(max_connections=settings.streams + 16, max_idle_per_origin=settings.streams,
                      read_timeout_s=settings.seconds)
    rss_idle = rss_bytes(pid)
    cpu_start = bench.cpu_seconds(pid)
    rss_peak = rss_idle
    started_at = time.monotonic()
    http_url = setup.router_http if settings.path == "http" else None
    async with AsyncSchedulerClient(setup.router_target, timeout_s=settings.seconds * 3, http_url=http_url) as sdk:
        tasks = []
        for i in range(settings.streams):
            tasks.append(asyncio.ensure_future(_one(settings, tally, sdk, http, url, body)))
            if settings.ramp_s > 0:
                await asyncio.sleep(settings.ramp_s / settings.streams)
            if i % 50 == 0:
                rss_peak = max(rss_peak, rss_bytes(pid))
        while not all(t.done() for t in tasks):
            rss_peak = max(rss_peak, rss_bytes(pid))
            await asyncio.sleep(0.5)
        await asyncio.gather(*tasks)
    wall_s = time.monotonic() - started_at
    cpu_s = bench.cpu_seconds(pid) - cpu_start
    await http.aclose()
    await asyncio.sleep(1.0)
    ttfts = sorted(tally.ttfts)
    return {
        "path": settings.path, "streams": settings.streams, "seconds_per_stream": settings.seconds,
        "tokens_per_stream": settings.max_tokens, "ramp_s": settings.ramp_s,
        "completed": tally.completed, "errors": dict(tally.errors), "open_peak": tally.open_peak,
        "ttft_ms": {"p50": bench.percentile(ttfts, 0.5) * 1e3, "p99": bench.percentile(ttfts, 0.99) * 1e3}
        if ttfts else None,
        "wall_s": wall_s, "router_cpu_s": cpu_s, "router_cpu_ms_per_stream": cpu_s * 1e3 / max(1, tally.started),
        "router_rss_mib": {"idle": rss_idle / 2**20, "peak": rss_peak / 2**20, "after": rss_bytes(pid) / 2**20},
        "rss_kib_per_open_stream": (rss_peak - rss_idle) / 1024 / max(1, tally.open_peak),
    }


def run_load_bench(settings: LoadSettings) -> int:
    if settings.path not in PATHS:
        print(f"--path: one of {', '.join(PATHS)}, got {settings.path!r}", file=sys.stderr)
        return 2
    interval_ms = settings.seconds * 1000 / settings.max_tokens
    router_settings = bench.Settings(vllm_router=False, token_interval_ms=interval_ms, progress=False)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        processes = bench.Processes(Path(tmp))
        try:
            setup = bench.start_all(router_settings, processes)
            report = asyncio.run(_drive(settings, setup))
        finally:
            processes.stop_all()
    rss = report["router_rss_mib"]
    ttft = report["ttft_ms"] or {}
    print(f"load bench: {settings.streams} concurrent {settings.path} streams of {settings.max_tokens} tokens over "
          f"{settings.seconds:g} s each (ramped over {settings.ramp_s:g} s), one router process; "
          f"{os.cpu_count()} CPUs")
    print(f"completed {report['completed']} of {settings.streams}, errors {report['errors'] or 0}, "
          f"open at once (peak) {report['open_peak']}")
    print(f"TTFT with the others open: p50 {ttft.get('p50', float('nan')):.1f} ms, p99 {ttft.get('p99', float('nan')):.1f} ms")
    print(f"router CPU {report['router_cpu_s']:.1f} s over {report['wall_s']:.0f} s "
          f"({report['router_cpu_ms_per_stream']:.2f} ms per stream)")
    print(f"router RSS: idle {rss['idle']:.1f} MiB, peak {rss['peak']:.1f} MiB, after {rss['after']:.1f} MiB; "
          f"{report['rss_kib_per_open_stream']:.1f} KiB per open stream")
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"JSON: {settings.json_path}")
    return 0 if not report["errors"] and report["completed"] == settings.streams else 1
