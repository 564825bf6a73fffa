"""``scheduler bench router``: our router side by side with calling the backend directly and
with a second router (vllm-router, or any OpenAI-compatible router given by URL).

One run starts two OpenAI-compatible backends (``scheduler.server.stub_region``, unless
``--backends`` names running ones), our router (``scheduler router``: memory state, one
region per backend, dispatch tickets signed with keys from ``scheduler tickets keygen``) and,
when the ``bench`` extra is installed, vllm-router over the same backends. It then streams
the same completion over each path:

* ``direct``: HTTP/SSE to a backend (alternating between them), the baseline;
* ``vllm-router`` (or ``--against URL``): HTTP/SSE through the second router;
* ``ours-proxy``: the SDK's proxy mode given the router's HTTP address: ``Generate`` over the
  HTTP front door (Connect streaming) through our router;
* ``ours-grpc``: the SDK's proxy mode over gRPC (``Generate``) through our router;
* ``ours-openai``: HTTP/SSE through our router's OpenAI-compatible front door (``--http-port``);
* ``ours-direct``: the SDK's direct mode: ``Route`` over our router's HTTP front door (Connect
  protocol), then HTTP/SSE to the region.

Every HTTP path is driven by the same client (``scheduler.http.client``), so their differences
are the servers'.

For each concurrency the paths get a warm-up, then ``--rounds`` alternating rounds (the order
rotates every round) so that drift on a shared machine hits every path alike. TTFT is taken
by the client, from just before the request is built to the first text. A router's CPU per
stream is the growth of utime+stime in ``/proc/<pid>/stat`` over that path's rounds divided
by its streams; in direct mode that is our router's CPU for one ``Route``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import itertools
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.http.client import HttpClient

BENCH_MODEL = "llama-3.1-8b"
# One region of the shipped fleet per backend (each lists BENCH_MODEL).
BENCH_REGIONS = ("eu-north", "eu-central", "uk-south", "us-east")
PROMPT = "Summarise the energy cost of serving one language-model request in a sentence."

DIRECT = "direct"
VLLM_ROUTER = "vllm-router"
OURS_PROXY = "ours-proxy"
OURS_GRPC = "ours-grpc"
OURS_OPENAI = "ours-openai"
OURS_DIRECT = "ours-direct"
NOT_INSTALLED = "not installed: pip install '.[bench]'"

# The goals: direct mode's router CPU per request and added TTFT (issue 11); the proxy path's
# router CPU per 16-token stream, added TTFT at concurrency 1 and throughput at 32 against the
# second router's (issue 13).
GOAL_ROUTE_CPU_MS = 0.3
GOAL_TTFT_CONCURRENCY = 1
GOAL_PROXY_CPU_MS = 1.0
GOAL_PROXY_ADDED_TTFT_MS = 1.0
GOAL_THROUGHPUT_CONCURRENCY = 32
GOAL_THROUGHPUT_SHARE = 0.7

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Settings:
    requests: int = 800
    concurrency: tuple[int, ...] = (1, 32)
    rounds: int = 4
    warmup: int = 50
    max_tokens: int = 16
    first_token_delay_ms: float = 0.0
    # The stub backends' time between two tokens (0: as fast as they can).
    token_interval_ms: float = 0.0
    backends: tuple[str, ...] = ()
    against: str | None = None
    against_pid: int | None = None
    against_name: str = "against"
    vllm_router: bool = True
    vllm_router_policy: str = "round_robin"
    idle_s: float = 3.0
    json_path: Path | None = None
    progress: bool = True
    # How our router's process starts, after the interpreter: ``scheduler.cli`` (a diagnostic
    # such as scripts/route_breakdown.py puts its own entry point here, which then runs it).
    router_entry: tuple[str, ...] = ("-m", "scheduler.cli")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of process ``pid`` so far (``/proc/<pid>/stat``; clock ticks)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    # Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    fields = raw[raw.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


# --- processes -------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Processes:
    """Every process the bench starts; ``stop_all`` ends them (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Process] = []

    def spawn(self, name: str, command: list[str]) -> Process:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as log:
            # Own session: a Ctrl-C in the terminal reaches only the bench, which stops them in order.
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        process = Process(name, popen, log_path)
        self.started.append(process)
        return process

    def wait_for_line(self, process: Process, pattern: re.Pattern[str], timeout_s: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = pattern.search(process.log_path.read_text(errors="replace"))
            if match:
                return match
            if process.popen.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{process.name} did not start (exit {process.popen.poll()}):\n{process.log_tail()}")

    def wait_for_http(self, process: Process, url: str, timeout_s: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{process.name} did not answer {url} (exit {process.popen.poll()}):\n{process.log_tail()}")

    def stop_all(self) -> None:
        for process in self.started:
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        self.started.clear()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def vllm_router_installed() -> bool:
    return importlib.util.find_spec("vllm_router") is not None


@dataclass
class Setup:
    backends: tuple[str, ...]
    backend_pids: tuple[int, ...]
    router_target: str
    router_http: str
    router_pid: int
    against_url: str | None
    against_pid: int | None
    against_name: str | None
    against_note: str


def start_all(settings: Settings, processes: Processes) -> Setup:
    import yaml

    from scheduler.cli import build_parser
    from scheduler.plugins.checked_fleet import load_checked_fleet

    work = processes.workdir
    backend_pids: list[int] = []
    backends = list(settings.backends)
    if not backends:
        stubs = [processes.spawn(f"backend-{i}", [
            sys.executable, "-m", "scheduler.server.stub_region", "--port", "0", "--name", f"backend-{i}",
            "--first-token-delay-ms", str(settings.first_token_delay_ms),
            "--token-interval-ms", str(settings.token_interval_ms)]) for i in range(2)]
        for stub in stubs:
            port = int(processes.wait_for_line(stub, re.compile(r"PORT (\d+)")).group(1))
            backends.append(f"http://127.0.0.1:{port}")
            backend_pids.append(stub.pid)
    if len(backends) > len(BENCH_REGIONS):
        raise ValueError(f"at most {len(BENCH_REGIONS)} backends")

    # Second router: vllm-router over the same backends (started now, while ours starts too).
    against_url, against_pid, against_name, note = None, None, None, ""
    vllm = None
    if settings.against:
        against_url, against_pid, against_name = settings.against, settings.against_pid, settings.against_name
        note = "" if against_pid is not None else "CPU not measured: give --against-pid"
    elif not settings.vllm_router:
        note = "left out (--no-vllm-router)"
    elif not vllm_router_installed():
        note = NOT_INSTALLED
    else:
        port = free_port()
        vllm = processes.spawn(VLLM_ROUTER, [
            sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *backends, "--policy", settings.vllm_router_policy, "--log-level", "warning"])
        against_url, against_pid, against_name = f"http://127.0.0.1:{port}", vllm.pid, VLLM_ROUTER

    # Our router: one region per backend, ticket keys from `scheduler tickets keygen`.
    regions_dir = work / "regions"
    regions_dir.mkdir()
    shipped = {r.name: r for r in load_checked_fleet().regions}
    for name, endpoint in zip(BENCH_REGIONS, backends, strict=False):
        raw = shipped[name].model_copy(update={"endpoint": endpoint}).model_dump(mode="json")
        (regions_dir / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    # The stub backends publish no live state: the bench's policy trusts a region it has never
    # seen (the shipped default does so only for the router's first 30 s).
    policies_dir = work / "policies"
    policies_dir.mkdir()
    default = load_checked_fleet().policy("default").model_dump(mode="json")
    default["unknown_region_state"] = {**default["unknown_region_state"], "missing": "assume-healthy"}
    (policies_dir / "default.yaml").write_text(yaml.safe_dump(default))
    keygen = build_parser().parse_args(["tickets", "keygen", "--regions", str(regions_dir)])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = keygen.handler(keygen)
    if code != 0:
        raise RuntimeError(f"scheduler tickets keygen failed ({code})")
    keys_file = work / "ticket-keys.yaml"
    keys_file.write_text(out.getvalue())
    keys_file.chmod(0o600)
    router = processes.spawn("router", [
        sys.executable, *settings.router_entry, "router", "--host", "127.0.0.1", "--port", "0",
        "--regions", str(regions_dir), "--policies", str(policies_dir), "--state", "memory", "--rate-limit", "1000000",
        "--ticket-keys", str(keys_file), "--grace", "1", "--http-port", "0",
        # A loopback benchmark: no API keys (the router warns), no per-tenant stream cap in reach.
        "--insecure", "--max-streams-per-tenant", "100000"])
    router_port = int(processes.wait_for_line(router, re.compile(r"router listening on [^:]+:(\d+)")).group(1))
    router_http = processes.wait_for_line(router, re.compile(r"HTTP front door on (http://\S+)")).group(1)
    if vllm is not None:
        processes.wait_for_http(vllm, f"{against_url}/health")
    return Setup(tuple(backends), tuple(backend_pids), f"127.0.0.1:{router_port}", router_http, router.pid,
                 against_url, against_pid, against_name, note)


# --- one stream per path ---------------------------------------------------------------------


class StreamError(Exception):
    pass


def completions_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/completions") else base + "/v1/completions"


async def http_stream(client: HttpClient, url: str, body: bytes) -> float:
    """One streamed completion over HTTP/SSE; the seconds to the first text."""
    from scheduler.sse_parser import DONE, SseParser

    parser = SseParser()
    first = None
    done = False
    start = time.perf_counter()
    async with client.stream("POST", url, body=body, headers={"content-type": "application/json"},
                             read_timeout_s=30.0) as reply:
        if reply.status != 200:
            raise StreamError(f"HTTP {reply.status}: {(await reply.read())[:200]!r}")
        async for data in reply.chunks():
            for payload in parser.feed(data):
                if payload == DONE:
                    done = True
                elif first is None and not done:
                    choices = json.loads(payload).get("choices") or []
                    if choices and choices[0].get("text"):
                        first = time.perf_counter()
    if first is None or not done:
        raise StreamError("no text" if first is None else "stream ended without [DONE]")
    return first - start


@dataclass
class SdkCounts:
    receipts: int = 0
    retries: int = 0


async def sdk_stream(client: Any, mode: str, max_tokens: int, counts: SdkCounts) -> float:
    first = None
    start = time.perf_counter()
    generation = client.generate(PROMPT, model=BENCH_MODEL, max_tokens=max_tokens, mode=mode, timeout_s=30.0)
    async for text in generation:
        if first is None and text:
            first = time.perf_counter()
    if first is None:
        raise StreamError("no text")
    counts.receipts += generation.receipt is not None
    counts.retries += max(0, generation.attempts - 1)
    return first - start


# --- rounds ----------------------------------------------------------------------------------


@dataclass
class PathRun:
    """One path at one concurrency, summed over its rounds."""

    ttfts: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    router_cpu_s: float = 0.0
    backend_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


@dataclass
class BenchPath:
    name: str
    one: Callable[[], Awaitable[float]]
    router_pid: int | None
    counts: SdkCounts | None = None


def _cpu(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


async def run_streams(path: BenchPath, count: int, concurrency: int, tick: Callable[[], None],
                      into: PathRun | None, backend_pids: Sequence[int]) -> None:
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            try:
                ttft = await path.one()
            except Exception as exc:  # every failure counts as an error of this path
                if into is not None:
                    into.errors += 1
                    if len(into.error_samples) < 3:
                        into.error_samples.append(f"{type(exc).__name__}: {exc}"[:300])
            else:
                if into is not None:
                    into.ttfts.append(ttft)
            tick()

    router_pids = [path.router_pid] if path.router_pid is not None else []
    router0, backend0, client0, wall0 = _cpu(router_pids), _cpu(backend_pids), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    if into is not None:
        into.wall_s += time.perf_counter() - wall0
        into.client_cpu_s += time.process_time() - client0
        into.backend_cpu_s += _cpu(backend_pids) - backend0
        into.router_cpu_s += _cpu(router_pids) - router0


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _figures(run: PathRun, base: PathRun | None, has_router: bool, idle_ms_per_s: float | None,
             counts: SdkCounts | None) -> dict[str, Any]:
    streams = len(run.ttfts) + run.errors
    ok = run.ttfts
    ms = 1e3

    def per_stream(seconds: float) -> float | None:
        return seconds * ms / streams if streams else None

    figures: dict[str, Any] = {
        "streams": streams,
        "errors": run.errors,
        "error_samples": run.error_samples,
        "ttft_ms": {"p50": percentile(ok, 0.5) * ms, "p99": percentile(ok, 0.99) * ms,
                    "mean": sum(ok) / len(ok) * ms} if ok else None,
        "added_ttft_ms": None,
        "router_cpu_ms_per_stream": per_stream(run.router_cpu_s) if has_router else None,
        "router_cpu_ms_per_stream_net_of_idle": None,
        "backend_cpu_ms_per_stream": per_stream(run.backend_cpu_s),
        "client_cpu_ms_per_stream": per_stream(run.client_cpu_s),
        "streams_per_s": len(ok) / run.wall_s if run.wall_s > 0 else None,
        "wall_s": run.wall_s,
    }
    if ok and base is not None and base.ttfts:
        figures["added_ttft_ms"] = {"p50": (percentile(ok, 0.5) - percentile(base.ttfts, 0.5)) * ms,
                                    "p99": (percentile(ok, 0.99) - percentile(base.ttfts, 0.99)) * ms}
    if has_router and idle_ms_per_s is not None and streams:
        figures["router_cpu_ms_per_stream_net_of_idle"] = (run.router_cpu_s * ms - idle_ms_per_s * run.wall_s) / streams
    if counts is not None:
        figures["receipts"] = counts.receipts
        figures["retries"] = counts.retries
    return figures


async def measure(settings: Settings, setup: Setup, on_idle: Callable[[dict[str, float]], None]) -> list[dict[str, Any]]:
    from tqdm import tqdm

    from scheduler.client import AsyncSchedulerClient

    body = json.dumps({"model": BENCH_MODEL, "prompt": PROMPT, "max_tokens": settings.max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    widest = max(settings.concurrency)
    direct_urls = itertools.cycle([completions_url(b) for b in setup.backends])
    proxy_counts, grpc_counts, direct_counts = SdkCounts(), SdkCounts(), SdkCounts()
    runs: list[dict[str, Any]] = []
    idle: dict[str, float] = {}

    async def idle_cpu() -> dict[str, float]:
        """Each router's CPU per second while no stream runs (its background work), after a
        settling second: what the per-stream figures include besides the streams."""
        pids = {"ours": setup.router_pid}
        if setup.against_pid is not None:
            pids[setup.against_name or "against"] = setup.against_pid
        await asyncio.sleep(1.0)
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        await asyncio.sleep(settings.idle_s)
        return {name: (cpu_seconds(pid) - before[name]) * 1e3 / settings.idle_s for name, pid in pids.items()}

    http = HttpClient(max_connections=4 * widest, max_idle_per_origin=4 * widest, read_timeout_s=30.0)
    async with AsyncSchedulerClient(setup.router_target, timeout_s=30.0, http_url=setup.router_http) as sdk, \
            AsyncSchedulerClient(setup.router_target, timeout_s=30.0) as grpc_sdk:
        paths = [BenchPath(DIRECT, lambda: http_stream(http, next(direct_urls), body), None)]
        if setup.against_url is not None:
            against = completions_url(setup.against_url)
            paths.append(BenchPath(setup.against_name or "against", lambda: http_stream(http, against, body),
                               setup.against_pid))
        ours_openai = completions_url(setup.router_http)
        paths += [
            BenchPath(OURS_PROXY, lambda: sdk_stream(sdk, "proxy", settings.max_tokens, proxy_counts),
                      setup.router_pid, proxy_counts),
            BenchPath(OURS_GRPC, lambda: sdk_stream(grpc_sdk, "proxy", settings.max_tokens, grpc_counts),
                      setup.router_pid, grpc_counts),
            BenchPath(OURS_OPENAI, lambda: http_stream(http, ours_openai, body), setup.router_pid),
            BenchPath(OURS_DIRECT, lambda: sdk_stream(sdk, "direct", settings.max_tokens, direct_counts),
                      setup.router_pid, direct_counts),
        ]

        total = len(paths) * len(settings.concurrency) * (settings.warmup + settings.requests)
        with tqdm(total=total, unit="stream", disable=not settings.progress, leave=False, file=sys.stderr) as bar:
            def tick() -> None:
                bar.update(1)

            for concurrency in settings.concurrency:
                results = {path.name: PathRun() for path in paths}
                for path in paths:
                    bar.set_description(f"c={concurrency} warm-up {path.name}")
                    await run_streams(path, settings.warmup, concurrency, tick, None, setup.backend_pids)
                if settings.idle_s > 0 and not idle:
                    bar.set_description("idle CPU")
                    idle = await idle_cpu()
                    on_idle(idle)
                for counts in (proxy_counts, grpc_counts, direct_counts):
                    counts.receipts = counts.retries = 0
                for number, count in enumerate(split(settings.requests, settings.rounds)):
                    rotation = number % len(paths)
                    for path in paths[rotation:] + paths[:rotation]:
                        bar.set_description(f"c={concurrency} round {number + 1}/{settings.rounds} {path.name}")
                        await run_streams(path, count, concurrency, tick, results[path.name], setup.backend_pids)
                base = results[DIRECT]
                figures = {}
                for path in paths:
                    router_idle = None
                    if path.router_pid is not None:
                        router_idle = idle.get("ours" if path.router_pid == setup.router_pid else path.name)
                    figures[path.name] = _figures(results[path.name], None if path.name == DIRECT else base,
                                                  path.router_pid is not None, router_idle, path.counts)
                runs.append({"concurrency": concurrency, "paths": figures})
    await http.aclose()
    return runs


# --- report ----------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(run: dict[str, Any]) -> str:
    head = (f"{'path':<14}{'TTFT p50':>10}{'p99':>9}{'added p50':>11}{'p99':>9}{'router CPU':>12}"
            f"{'client CPU':>12}{'streams/s':>11}{'errors':>8}")
    unit = f"{'':<14}{'ms':>10}{'ms':>9}{'ms':>11}{'ms':>9}{'ms/stream':>12}{'ms/stream':>12}{'':>11}{'':>8}"
    lines = [head, unit]
    for name, f in run["paths"].items():
        ttft, added = f["ttft_ms"] or {}, f["added_ttft_ms"] or {}
        lines.append(
            f"{name:<14}{_fmt(ttft.get('p50')):>10}{_fmt(ttft.get('p99')):>9}{_fmt(added.get('p50')):>11}"
            f"{_fmt(added.get('p99')):>9}{_fmt(f['router_cpu_ms_per_stream'], 3):>12}"
            f"{_fmt(f['client_cpu_ms_per_stream'], 3):>12}{_fmt(f['streams_per_s'], 0):>11}{f['errors']:>8}")
    return "\n".join(lines)


def _path(runs: list[dict[str, Any]], concurrency: int, name: str | None) -> dict[str, Any] | None:
    run = next((r for r in runs if r["concurrency"] == concurrency), None)
    return None if run is None or name is None else run["paths"].get(name)


def goals(runs: list[dict[str, Any]], against_name: str | None) -> dict[str, Any]:
    """Each goal with its figures and a verdict (None: not measurable in this run)."""
    result: dict[str, Any] = {}
    for key, path, limit in (("direct_mode_router_cpu", OURS_DIRECT, GOAL_ROUTE_CPU_MS),
                             ("proxy_router_cpu", OURS_PROXY, GOAL_PROXY_CPU_MS),
                             ("openai_router_cpu", OURS_OPENAI, GOAL_PROXY_CPU_MS),
                             ("grpc_router_cpu", OURS_GRPC, GOAL_PROXY_CPU_MS)):
        cpu = {str(r["concurrency"]): r["paths"][path]["router_cpu_ms_per_stream"] for r in runs if path in r["paths"]}
        measured = [v for v in cpu.values() if v is not None]
        result[key] = {"goal": f"our router's CPU per {'request' if path == OURS_DIRECT else 'stream'} in {path} "
                               f"<= {limit} ms", "ms": cpu,
                       "pass": (bool(measured) and all(v <= limit for v in measured)) if measured else None}
    theirs = _path(runs, GOAL_TTFT_CONCURRENCY, against_name)
    ours = _path(runs, GOAL_TTFT_CONCURRENCY, OURS_DIRECT)
    added = None if ours is None or theirs is None or not ours["added_ttft_ms"] or not theirs["added_ttft_ms"] else (
        ours["added_ttft_ms"]["p50"], theirs["added_ttft_ms"]["p50"])
    result["direct_mode_added_ttft"] = {
        "goal": f"TTFT added by {OURS_DIRECT} at concurrency {GOAL_TTFT_CONCURRENCY} (p50) <= the second router's",
        "ms": None if added is None else {OURS_DIRECT: added[0], against_name: added[1]},
        "pass": None if added is None else added[0] <= added[1]}
    for key, path in (("proxy_added_ttft", OURS_PROXY), ("openai_added_ttft", OURS_OPENAI),
                      ("grpc_added_ttft", OURS_GRPC)):
        figures = _path(runs, GOAL_TTFT_CONCURRENCY, path)
        value = None if figures is None or not figures["added_ttft_ms"] else figures["added_ttft_ms"]["p50"]
        result[key] = {"goal": f"TTFT added by {path} at concurrency {GOAL_TTFT_CONCURRENCY} (p50) "
                               f"<= {GOAL_PROXY_ADDED_TTFT_MS} ms",
                       "ms": value, "pass": None if value is None else value <= GOAL_PROXY_ADDED_TTFT_MS}
    theirs = _path(runs, GOAL_THROUGHPUT_CONCURRENCY, against_name)
    for key, path in (("proxy_throughput", OURS_PROXY), ("openai_throughput", OURS_OPENAI),
                      ("grpc_throughput", OURS_GRPC)):
        ours = _path(runs, GOAL_THROUGHPUT_CONCURRENCY, path)
        share = None if ours is None or theirs is None or not theirs["streams_per_s"] or ours["streams_per_s"] is None \
            else ours["streams_per_s"] / theirs["streams_per_s"]
        result[key] = {"goal": f"{path} streams/s at concurrency {GOAL_THROUGHPUT_CONCURRENCY} >= "
                               f"{GOAL_THROUGHPUT_SHARE:.0%} of the second router's",
                       "share": share, "pass": None if share is None else share >= GOAL_THROUGHPUT_SHARE}
    return result


def goal_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for goal in result.values():
        verdict = "SKIP" if goal["pass"] is None else "PASS" if goal["pass"] else "FAIL"
        if "share" in goal:
            shown = "not measured" if goal["share"] is None else f"{goal['share']:.0%}"
        elif isinstance(goal["ms"], dict):
            shown = ", ".join(f"{k}: {_fmt(v, 3)} ms" for k, v in goal["ms"].items())
        else:
            shown = "not measured" if goal["ms"] is None else f"{goal['ms']:.2f} ms"
        lines.append(f"{verdict}  {goal['goal']} ({shown})")
    return lines


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_router_bench(settings: Settings, command: str | None = None) -> int:
    command = command or "scheduler bench router"
    load_before = os.getloadavg()[0]
    idle: dict[str, float] = {}
    # A SIGTERM to the bench stops what it started too (Ctrl-C does already: KeyboardInterrupt).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
            processes = Processes(Path(tmp))
            try:
                setup = start_all(settings, processes)
                runs = asyncio.run(measure(settings, setup, idle.update))
            except BaseException:
                for process in processes.started:
                    code = process.popen.poll()
                    if code is not None and code not in (0, -signal.SIGTERM):
                        print(f"--- {process.name} exited {code}:\n{process.log_tail()}", file=sys.stderr)
                raise
            finally:
                processes.stop_all()
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)

    load_after = os.getloadavg()[0]
    second = setup.against_name
    report: dict[str, Any] = {
        "command": command,
        "settings": {
            "requests_per_path": settings.requests, "rounds": settings.rounds, "warmup": settings.warmup,
            "concurrency": list(settings.concurrency), "max_tokens": settings.max_tokens,
            "first_token_delay_ms": settings.first_token_delay_ms, "backends": list(setup.backends),
            "backends_started": not settings.backends, "vllm_router_policy": settings.vllm_router_policy,
            "ticket_keys": True,
        },
        "machine": {"cpus": os.cpu_count(), "load_1m_before": load_before, "load_1m_after": load_after,
                    "clk_tck": CLK_TCK},
        "routers": {"ours": {"idle_cpu_ms_per_s": idle.get("ours")}},
        "skipped": {},
        "runs": runs,
    }
    if second is not None:
        report["routers"][second] = {"url": setup.against_url, "pid_measured": setup.against_pid is not None,
                                     "idle_cpu_ms_per_s": idle.get(second)}
    else:
        report["skipped"][VLLM_ROUTER] = setup.against_note
    report["goals"] = goals(runs, second)

    print(f"router bench: {settings.requests} streams per path per concurrency in {settings.rounds} alternating "
          f"rounds (+{settings.warmup} warm-up), max_tokens {settings.max_tokens}, backend first-token delay "
          f"{settings.first_token_delay_ms:g} ms, {len(setup.backends)} backends; our router with ticket keys; "
          f"{os.cpu_count()} CPUs, load {load_before:.1f} -> {load_after:.1f}")
    if second is None:
        print(f"{VLLM_ROUTER}: {setup.against_note}; skipped")
    elif setup.against_note:
        print(f"{second}: {setup.against_note}")
    for run in runs:
        print(f"\nconcurrency {run['concurrency']}")
        print(table(run))
    idle_shown = ", ".join(f"{name} {_fmt(value, 2)} ms/s" for name, value in idle.items())
    if idle_shown:
        print(f"\nrouter CPU when idle (included above): {idle_shown}")
    print()
    for line in goal_lines(report["goals"]):
        print(line)
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nJSON: {settings.json_path}")
    return 0


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        requests=args.requests, concurrency=parse_concurrency(args.concurrency), rounds=args.rounds,
        warmup=args.warmup, max_tokens=args.max_tokens, first_token_delay_ms=args.first_token_delay_ms,
        backends=tuple(u for u in (args.backends or "").split(",") if u), against=args.against,
        against_pid=args.against_pid, against_name=args.against_name, vllm_router=not args.no_vllm_router,
        vllm_router_policy=args.vllm_router_policy, idle_s=args.idle_s, json_path=args.json,
        progress=not args.no_progress,
    )


def parse_concurrency(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--concurrency: positive integers separated by commas, got {text!r}")
    return values
