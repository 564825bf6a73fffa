"""``scheduler gate measure``: run a request set (``scheduler.gate.request_set``) through a
router's OpenAI-compatible front door or a region's gateway, and record J per output token
per bucket from the receipts (``scheduler.gate.stats``).

Both speak the OpenAI streaming API; the receipt comes differently:

- a router (``scheduler router --http-port``): the receipt in the final usage chunk's
  ``usage.energy_receipt`` (the request asks ``include_usage``; without it, an ``event:
  energy_receipt`` event after ``data: [DONE]``: docs/http-front-door.md), which names the
  region and pool, the config version and the measurement source;
- a region's gateway (``--pool`` names the pool; it must run with tickets disabled, as a
  local or staging region does, since only a router can sign tickets): the ``energy`` object
  of the final usage chunk (scheduler.region.energy_report); the region's name comes from its
  ``GET /state`` once, the pool from the ``x-scheduler-pool`` header.

A stream that fails, or ends without energy or without output tokens, is no sample: it is
counted in ``failed`` with its error, and ``measure`` exits 1 once the file is written.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from scheduler.gate.request_set import Call, RequestSet, calls
from scheduler.gate.stats import Sample, stable, summarise

FORMAT = "carbon-scheduler-gate-measurement/1"
# Errors kept in the file (all are counted).
KEPT_ERRORS = 20


class StreamFailed(Exception):
    """A stream that gave no sample; the message says why."""


class TargetError(Exception):
    """The target is not what the arguments say it is (e.g. --pool against a router)."""


@dataclass(frozen=True)
class Target:
    # The base URL the OpenAI paths go under: http://router:8080, http://127.0.0.1:8000/eu-north.
    url: str
    api_key: str | None = None
    # The region pool to run on (a region's gateway only); None: the router decides.
    pool: str | None = None
    timeout_s: float = 600.0


def sample_of(energy: dict[str, Any], usage: dict[str, Any], place: str, config_version: str = "") -> Sample:
    """A sample from a receipt (a router's) or an ``energy`` object (a region's) and the usage."""
    try:
        tokens = int(energy.get("completion_tokens") or usage.get("completion_tokens") or 0)
        prompt = int(energy.get("prompt_tokens") or usage.get("prompt_tokens") or 0)
        sample = Sample(
            energy_j=float(energy["energy_j"]), energy_j_low=float(energy["energy_j_low"]),
            energy_j_high=float(energy["energy_j_high"]), completion_tokens=tokens, prompt_tokens=prompt,
            measurement_source=str(energy.get("measurement_source", "")),
            attribution_method=str(energy.get("attribution_method", "")), place=place,
            batch_size=float(energy["batch_size"]) if energy.get("batch_size") is not None else None,
            config_version=config_version,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StreamFailed(f"the receipt lacks a usable {exc}: {json.dumps(energy)[:200]}") from None
    if tokens <= 0:
        raise StreamFailed("the answer has no output tokens: no J per token")
    return sample


async def read_stream(lines: AsyncIterator[str], region_pool: str) -> Sample:
    """The sample of one answered stream (module doc); ``region_pool``: where a region's
    gateway ran it (a router's receipt says where itself)."""
    event = ""
    usage: dict[str, Any] = {}
    energy: dict[str, Any] | None = None
    receipt: dict[str, Any] | None = None
    async for line in lines:
        if not line:
            event = ""
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
            continue
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            raise StreamFailed(f"the stream failed: {json.dumps(chunk['error'])[:300]}")
        if event == "energy_receipt" or "energy_receipt" in chunk:
            receipt = chunk.get("energy_receipt")
        if isinstance(chunk.get("usage"), dict) and not chunk.get("choices"):
            usage = chunk["usage"]
            if isinstance(usage.get("energy_receipt"), dict):
                receipt = usage["energy_receipt"]
            if isinstance(chunk.get("energy"), dict):
                energy = chunk["energy"]
    if receipt is not None:
        place = f"{receipt.get('region', '')}/{receipt.get('pool', '')}"
        return sample_of(receipt, usage, place, str(receipt.get("config_version", "")))
    if energy is not None:
        return sample_of(energy, usage, region_pool)
    raise StreamFailed("the stream ended without an energy receipt")


async def region_of(client: httpx.AsyncClient, target: Target) -> str:
    """The name of the region whose gateway ``target.url`` is (its ``GET /state``)."""
    name: object = None
    try:
        response = await client.get(target.url.rstrip("/") + "/state")
        if response.status_code == 200:
            name = response.json().get("region")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        name = exc
    if not isinstance(name, str) or not name:
        raise TargetError(f"{target.url}/state did not answer as a region's gateway ({name or 'no region'}): "
                          "--pool is for a region; leave it out for a router")
    return name


async def send(client: httpx.AsyncClient, target: Target, call: Call, region: str = "") -> Sample:
    headers = {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with client.stream("POST", target.url.rstrip("/") + call.path, json=call.body,
                                 headers=headers) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                raise StreamFailed(f"HTTP {response.status_code}: {body[:300]}")
            pool = response.headers.get("x-scheduler-pool", target.pool or "")
            return await read_stream(response.aiter_lines(), f"{region}/{pool}")
    except httpx.HTTPError as exc:
        raise StreamFailed(f"{type(exc).__name__}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise StreamFailed(f"a stream event is not JSON: {exc}") from None


async def run_round(client: httpx.AsyncClient, target: Target, round_calls: list[Call], concurrency: int,
                    done: Callable[[], None], region: str = "") -> list[Sample | StreamFailed]:
    """Every call of the round, at most ``concurrency`` in flight (they start together, so
    the engines batch them)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(call: Call) -> Sample | StreamFailed:
        async with gate:
            try:
                return await send(client, target, call, region)
            except StreamFailed as exc:
                return exc
            finally:
                done()

    return list(await asyncio.gather(*(one(call) for call in round_calls)))


class Progress(Protocol):
    """What ``measure`` tells as it goes: streams to run (it grows with extra rounds) and done."""

    def grow(self, streams: int) -> None: ...

    def step(self, bucket: str) -> None: ...


class Silent:
    """No progress shown."""

    def grow(self, streams: int) -> None:
        pass

    def step(self, bucket: str) -> None:
        pass


async def measure(request_set: RequestSet, target: Target, *, model: str | None = None, label: str = "",
                  progress: Progress | None = None) -> dict[str, Any]:
    """The measurement file's content (docs/gate.md, "The measurement file")."""
    progress = progress or Silent()
    started = datetime.now(UTC)
    buckets: dict[str, Any] = {}
    errors: list[str] = []
    failed = 0
    rounds = request_set.rounds
    progress.grow(sum(len(calls(request_set, b, 0)) for b in request_set.buckets) * rounds.min)
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=request_set.concurrency, max_keepalive_connections=request_set.concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        region = await region_of(client, target) if target.pool is not None else ""
        for bucket in request_set.buckets:
            samples: list[Sample] = []
            ran = 0
            while True:
                round_calls = calls(request_set, bucket, ran, model=model, pool=target.pool)
                if ran >= rounds.min:
                    progress.grow(len(round_calls))
                results = await run_round(client, target, round_calls, request_set.concurrency,
                                          functools.partial(progress.step, bucket.name), region)
                ran += 1
                for result in results:
                    if isinstance(result, Sample):
                        samples.append(result)
                    else:
                        failed += 1
                        if len(errors) < KEPT_ERRORS:
                            errors.append(f"{bucket.name}: {result}")
                summary = summarise(samples)
                # A round that gave no sample at all: the target is not answering; more would not help.
                answered = any(isinstance(result, Sample) for result in results)
                if not answered or ran >= rounds.max or (ran >= rounds.min and stable(summary, rounds.target)):
                    break
            buckets[bucket.name] = {**summary.as_dict(), "rounds": ran, "stable": stable(summary, rounds.target),
                                    "samples": [asdict(s) for s in samples]}
    return {
        "format": FORMAT,
        "label": label,
        "against": target.url,
        "pool": target.pool,
        "model": model or request_set.model,
        "request_set": {"name": request_set.name, "sha256": request_set.digest,
                        "concurrency": request_set.concurrency, "rounds": rounds.model_dump()},
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "config_versions": sorted({v for b in buckets.values() for v in b["config_versions"]}),
        "failed": failed,
        "errors": errors,
        "buckets": buckets,
    }
