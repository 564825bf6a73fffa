"""``scheduler up --demo``: replay a scaled-down slice of the Azure LLM conversation trace
through the router (gRPC SDK) against the local regions, then report.

The slice: the first ``requests`` rows of ``azure_llm_2023_conv.csv`` (Patel et al., ISCA
2024; CC-BY), arrivals at their recorded offsets times ``time_scale``, context and output
lengths times ``token_scale`` (clipped to the tiny model's context). Prompts are built from
the tiny model's own tokenizer: each request belongs to one of ``conversations``
conversations and starts with that conversation's history (a multi-turn chat resends it),
so repeated prefixes meet the regions' prefix caches. Shares of the requests must stay in
one jurisdiction (EU, US, JP: data residency); the rest may run anywhere.

The report ends with each region's power caps as its serving side set them at start (its
``GET /power-caps``; on these CPU stand-ins: the dry run, what would be set on the GPUs).
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

TRACE = Path(__file__).resolve().parent.parent / "data" / "traces" / "azure_llm_2023_conv.csv"
MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class DemoOptions:
    requests: int = 150
    time_scale: float = 0.5
    token_scale: float = 0.25
    max_prompt_tokens: int = 1500
    max_output_tokens: int = 48
    conversations: int = 12
    # (jurisdiction, share of requests that must stay in it)
    residency: tuple[tuple[str, float], ...] = (("EU", 0.2), ("US", 0.15), ("JP", 0.1))
    concurrency: int = 16
    # Shares of the requests sent in direct mode (the SDK streams from the region itself) and
    # through the router's OpenAI-compatible front door; the rest: the SDK's proxy mode.
    direct_share: float = 0.25
    openai_share: float = 0.15
    probes: int = 20
    seed: int = 0
    # The router's API key (None: a router running without authentication).
    api_key: str | None = None
    trace: Path = TRACE


@dataclass(frozen=True)
class TraceRequest:
    offset_s: float
    prompt: str
    max_tokens: int
    conversation: int
    # Empty: may run anywhere.
    jurisdiction: str
    mode: str = "proxy"


@dataclass
class Outcome:
    mode: str = "proxy"
    region: str = ""
    pool: str = ""
    ttft_s: float | None = None
    router_ttft_ms: float | None = None
    energy_j: float = 0.0
    carbon_g: float | None = None
    prompt_tokens: int = 0
    reused_tokens: int = 0
    completion_tokens: int = 0
    fallbacks: tuple[str, ...] = ()
    measurement_source: str = ""
    error: str = ""


def _vocabulary(tokenizer: Any) -> list[str]:
    """Whole-word tokens, sorted: the tokenizer's dict order varies between runs."""
    # "Ġ" marks a leading space in byte-level BPE.
    words = {token.removeprefix("Ġ") for token in tokenizer.get_vocab()}
    return sorted(w for w in words if w.isascii() and w.isalpha() and len(w) > 2) or ["token"]


def _words(tokenizer: Any, rng: random.Random, vocabulary: Sequence[str], tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < tokens:
        ids.extend(tokenizer.encode(" ".join(rng.choices(vocabulary, k=64))).ids)
    return ids[:tokens]


def build_requests(options: DemoOptions, tokenizer: Any) -> list[TraceRequest]:
    rng = random.Random(options.seed)
    with options.trace.open(newline="") as handle:
        rows = [row for _, row in zip(range(options.requests), csv.DictReader(handle), strict=False)]
    start = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    vocabulary = _vocabulary(tokenizer)
    history_len = options.max_prompt_tokens
    histories = [_words(tokenizer, rng, vocabulary, history_len) for _ in range(options.conversations)]
    requests = []
    for row in rows:
        tokens = min(options.max_prompt_tokens, max(16, int(int(row["ContextTokens"]) * options.token_scale)))
        conversation = rng.randrange(options.conversations)
        shared = int(tokens * 0.75)
        ids = histories[conversation][:shared] + _words(tokenizer, rng, vocabulary, tokens - shared)
        offset = (datetime.fromisoformat(row["TIMESTAMP"][:26]) - start).total_seconds() * options.time_scale
        requests.append(TraceRequest(
            offset_s=offset,
            prompt=tokenizer.decode(ids),
            max_tokens=min(options.max_output_tokens, max(4, int(int(row["GeneratedTokens"]) * options.token_scale))),
            conversation=conversation,
            jurisdiction=_pick_jurisdiction(rng.random(), options.residency),
            mode=_pick_mode(rng.random(), options),
        ))
    return requests


def _pick_mode(draw: float, options: DemoOptions) -> str:
    if draw < options.direct_share:
        return "direct"
    return "openai" if draw < options.direct_share + options.openai_share else "proxy"


def _pick_jurisdiction(draw: float, residency: Sequence[tuple[str, float]]) -> str:
    for jurisdiction, share in residency:
        if draw < share:
            return jurisdiction
        draw -= share
    return ""


async def _openai(http: Any, url: str, api_key: str | None, request: TraceRequest, outcome: Outcome) -> Outcome:
    """One request through the router's OpenAI front door: the chunks, then the receipt event."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": request.prompt}],
            "max_tokens": request.max_tokens, "stream": True,
            "x_scheduler": {"tenant": "demo", "prefix_key": f"conversation-{request.conversation}",
                            "jurisdictions": [request.jurisdiction] if request.jurisdiction else []}}
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    receipt: dict[str, Any] | None = None
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120) as answer:
        if answer.status_code != 200:
            outcome.error = f"HTTP {answer.status_code}"
            return outcome
        async for line in answer.aiter_lines():
            if line.startswith("data:") and '"content":' in line and outcome.ttft_s is None:
                outcome.ttft_s = time.monotonic() - started
            if line.startswith("data:") and "energy_receipt" in line:
                receipt = json.loads(line.removeprefix("data:"))["energy_receipt"]
    if receipt is None:
        outcome.error = "no receipt"
        return outcome
    outcome.region, outcome.pool = receipt["region"], receipt["pool"]
    outcome.router_ttft_ms = receipt.get("ttft_ms")
    outcome.energy_j = receipt.get("energy_j", 0.0)
    outcome.carbon_g = receipt.get("carbon_g")
    outcome.prompt_tokens = receipt.get("prompt_tokens", 0)
    outcome.reused_tokens = receipt.get("reused_tokens", 0)
    outcome.completion_tokens = receipt.get("completion_tokens", 0)
    outcome.fallbacks = tuple(f["signal"] for f in receipt.get("fallbacks", ()))
    outcome.measurement_source = receipt.get("measurement_source", "")
    return outcome


async def _one(client: Any, request: TraceRequest, semaphore: asyncio.Semaphore, http: Any = None,
               http_url: str | None = None, api_key: str | None = None) -> Outcome:
    from scheduler.client import SchedulerRpcError

    outcome = Outcome(mode=request.mode)
    if request.mode == "openai":
        async with semaphore:
            if http is None or http_url is None:
                outcome.error = "no HTTP front door"
                return outcome
            return await _openai(http, http_url, api_key, request, outcome)
    async with semaphore:
        started = time.monotonic()
        generation = client.generate(
            request.prompt, model=MODEL, max_tokens=request.max_tokens, tenant="demo",
            prefix_key=f"conversation-{request.conversation}",
            jurisdictions=[request.jurisdiction] if request.jurisdiction else [], mode=request.mode,
        )
        try:
            async for _ in generation:
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.monotonic() - started
        except SchedulerRpcError as exc:
            outcome.error = exc.code.name
            return outcome
    receipt = generation.receipt
    if receipt is None:
        outcome.error = "no receipt"
        return outcome
    outcome.region = receipt.region
    outcome.pool = receipt.pool
    outcome.router_ttft_ms = receipt.ttft_ms if receipt.HasField("ttft_ms") else None
    outcome.energy_j = receipt.energy_j
    outcome.carbon_g = receipt.carbon_g if receipt.HasField("carbon_g") else None
    outcome.prompt_tokens = receipt.prompt_tokens
    outcome.reused_tokens = receipt.reused_tokens
    outcome.completion_tokens = receipt.completion_tokens
    outcome.fallbacks = tuple(f.signal for f in receipt.fallbacks)
    outcome.measurement_source = receipt.measurement_source
    return outcome


async def replay(target: str, requests: Sequence[TraceRequest], options: DemoOptions,
                 http_url: str | None = None) -> tuple[list[Outcome], float]:
    """Send ``requests`` at their offsets: SDK proxy and direct mode (Route over ``http_url``,
    the router's HTTP front door, when given) and, through ``http_url``, the OpenAI API."""
    import httpx
    from tqdm import tqdm

    from scheduler.client import AsyncSchedulerClient

    semaphore = asyncio.Semaphore(options.concurrency)
    started = time.monotonic()
    async with (AsyncSchedulerClient(target, api_key=options.api_key, timeout_s=120.0, http_url=http_url) as client,
                httpx.AsyncClient() as http):

        async def at_offset(request: TraceRequest) -> Outcome:
            await asyncio.sleep(max(0.0, started + request.offset_s - time.monotonic()))
            return await _one(client, request, semaphore, http, http_url, options.api_key)

        tasks = [asyncio.create_task(at_offset(r)) for r in requests]
        outcomes = []
        with tqdm(total=len(tasks), desc="replaying trace", unit="req") as bar:
            for done in asyncio.as_completed(tasks):
                outcomes.append(await done)
                bar.update()
    return outcomes, time.monotonic() - started


@dataclass
class TtftProbe:
    # Proxy mode, direct mode (Route + the region's stream), and the region alone (with a
    # ticket fetched beforehand, outside the timing).
    router_s: list[float] = field(default_factory=list)
    direct_mode_s: list[float] = field(default_factory=list)
    region_s: list[float] = field(default_factory=list)


async def probe_ttft(target: str, tokenizer: Any, options: DemoOptions, http_url: str | None = None) -> TtftProbe:
    """Sequential, unloaded requests of the same size, in turn: through the router, in direct
    mode, and straight to the region the router picks (each prompt is new: no cache hits)."""
    import httpx

    from scheduler.client import AsyncSchedulerClient
    from scheduler.client.common import auth_metadata, build_request
    from scheduler.client.direct import headers, region_body
    from scheduler.v1 import router_pb2_grpc

    rng = random.Random(options.seed + 1)
    vocabulary = _vocabulary(tokenizer)
    result = TtftProbe()
    async with (AsyncSchedulerClient(target, api_key=options.api_key, http_url=http_url) as client,
                httpx.AsyncClient(timeout=30) as http):
        for _ in range(options.probes):
            for mode, samples in (("proxy", result.router_s), ("direct", result.direct_mode_s)):
                prompt = tokenizer.decode(_words(tokenizer, rng, vocabulary, 200))
                started = time.monotonic()
                async for _ in client.generate(prompt, model=MODEL, max_tokens=4, tenant="probe", mode=mode):
                    samples.append(time.monotonic() - started)
                    break
            request = build_request(prompt=tokenizer.decode(_words(tokenizer, rng, vocabulary, 200)), model=MODEL,
                                    max_tokens=4, tenant="probe")
            stub = router_pb2_grpc.GlobalRouterStub(client._channel)  # type: ignore[no-untyped-call]
            target_ = (await stub.Route(request, metadata=auth_metadata(options.api_key))).targets[0]
            started = time.monotonic()
            async with http.stream("POST", target_.url, json=region_body(request, target_),
                                   headers=headers(target_)) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:") and '"choices":[{' in line:
                        result.region_s.append(time.monotonic() - started)
                        break
    return result


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def fetch_power_caps(regions: Sequence[Any], endpoint: Callable[[str], str], http: Any) -> list[Any]:
    """Each region's ``GET /power-caps`` (``RegionCapReport``); a region that does not answer
    gets the local dry run of its config instead, saying so."""
    from scheduler.region.power_caps import RegionCapReport, dry_run_report

    reports = []
    for region in regions:
        try:
            answer = await http.get(f"{endpoint(region.name)}/power-caps", timeout=10)
            answer.raise_for_status()
            reports.append(RegionCapReport.from_dict(answer.json()))
        except Exception as exc:  # any failure: the local dry run instead, which says why
            served = [p.pool for p in region.local.pools] if region.local is not None else None
            reports.append(dry_run_report(region, served, reason=f"the region's /power-caps did not answer "
                                                                 f"({type(exc).__name__}); local dry run"))
    return reports


def power_cap_section(reports: Sequence[Any]) -> list[str]:
    """One block per region/pool: configured cap, eco cap, what is (or would be) set."""
    if not reports:
        return []
    return ["", "power caps, as each region's serving side set them at start (GET /<region>/power-caps):",
            *(line for r in reports for line in r.lines())]


def report(outcomes: Sequence[Outcome], wall_s: float, probe: TtftProbe | None,
           power_caps: Sequence[Any] = ()) -> str:
    ok = [o for o in outcomes if not o.error]
    modes = Counter(o.mode for o in outcomes)
    failed_modes = Counter(o.mode for o in outcomes if o.error)
    lines = [f"{len(outcomes)} requests replayed in {wall_s:.1f} s: {len(ok)} answered, "
             f"{len(outcomes) - len(ok)} failed" + (f" ({dict(Counter(o.error for o in outcomes if o.error))})"
                                                   if len(ok) < len(outcomes) else ""),
             "by mode: " + ", ".join(f"{mode} {count} ({failed_modes[mode]} failed)"
                                     for mode, count in sorted(modes.items())),
             "",
             f"{'region/pool':<24}{'requests':>9}{'prompt tok':>12}{'reused tok':>12}{'energy J':>12}"
             f"{'gCO2e':>10}{'J/request':>11}"]
    for key in sorted({(o.region, o.pool) for o in ok}):
        mine = [o for o in ok if (o.region, o.pool) == key]
        lines.append(_row("/".join(key), mine))
    lines.append(_row("total", ok))
    fallbacks = Counter(f for o in ok for f in set(o.fallbacks))
    lines += ["", "fallbacks: " + (", ".join(f"{k} x{v}" for k, v in fallbacks.most_common()) or "none")]
    sources = Counter(o.measurement_source for o in ok)
    lines.append("energy measured by: " + ", ".join(f"{k} x{v}" for k, v in sources.items()))
    ttft = [o.ttft_s * 1000 for o in ok if o.ttft_s is not None]
    lines.append(f"TTFT through the router under trace load: p50 {percentile(ttft, 50):.0f} ms, "
                 f"p99 {percentile(ttft, 99):.0f} ms")
    if probe is not None and probe.router_s and probe.direct_mode_s and probe.region_s:
        parts = [f"{name} p50 {percentile([s * 1000 for s in samples], 50):.0f} ms "
                 f"(p99 {percentile([s * 1000 for s in samples], 99):.0f})"
                 for name, samples in (("proxy mode", probe.router_s), ("direct mode", probe.direct_mode_s),
                                       ("the region alone", probe.region_s))]
        lines.append(f"TTFT unloaded, {len(probe.router_s)} probes each: " + "; ".join(parts))
    prompt = sum(o.prompt_tokens for o in ok)
    reused = sum(o.reused_tokens for o in ok)
    lines.append(f"prefix-cache reuse: {reused:,} of {prompt:,} prompt tokens "
                 f"({100 * reused / prompt if prompt else 0:.1f} %)")
    lines += power_cap_section(power_caps)
    return "\n".join(lines)


def _row(name: str, outcomes: Sequence[Outcome]) -> str:
    energy = sum(o.energy_j for o in outcomes)
    carbon = [o.carbon_g for o in outcomes if o.carbon_g is not None]
    grams = f"{sum(carbon):.3f}" if carbon else "n/a"
    per = energy / len(outcomes) if outcomes else 0.0
    return (f"{name:<24}{len(outcomes):>9}{sum(o.prompt_tokens for o in outcomes):>12,}"
            f"{sum(o.reused_tokens for o in outcomes):>12,}{energy:>12.1f}{grams:>10}{per:>11.1f}")
