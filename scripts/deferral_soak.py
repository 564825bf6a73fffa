#!/usr/bin/env python3
"""A fast-forward soak of the deferral queue on a real Redis: is its memory bounded over time?

``python scripts/deferral_soak.py --hours 48 --rate 100 --speed 5`` submits deferrals at
``--rate`` per simulated second for ``--hours`` simulated hours through ``DeferralQueue`` and
releases them with ``DeferralWorker`` (the router's code, its Lua scripts, keys and TTLs), in its
own namespace of the Redis at ``--redis`` (deleted at the end). The queue's clock is injected: it
steps ``--step`` simulated seconds at a time, paced to run ``--speed`` times faster than real
time, and every TTL the queue gives Redis is shortened by the same factor, so Redis expires each
key when the simulated clock says it should. A driver that cannot keep the pace falls behind
real time, and its keys then expire early in simulated time: the run reports its largest lag,
which should stay well under the shortest TTL (15 min). Every ``--sample-hours`` it prints the
namespace's keys and their ``MEMORY USAGE`` by kind, the bytes the queue accounts against the
tenants' caps, and Redis's ``used_memory`` (all of this Redis, other users included).

The workload, half of the rate each (seeded, ``--seed``):

- ``flood``: one tenant sending ``--flood-prompt-bytes`` (200 kB) prompts with deadlines 20 h
  away, released 19 h later, never fetched: the tenant of issue 26, held at its caps;
- ``batch-0`` ... ``batch-8``: 1 kB prompts, deadlines 10-60 min away, released at a uniform
  time before the deadline less 5 min (a window), 1 kB answers; 99 % fetched and deleted
  (CancelDeferred) 1-10 min after their answer, 1 % never fetched (they expire with the result
  TTL).

Each release books what a router books per run, through the same keys and TTLs: the ledger's
entry (``scheduler.ledger.ledger.entry_key``) with its monthly hash, and the audit stream entry
(``scheduler.server.audit``, ``AUDIT_MAXLEN``) with its marker; the entry and the marker are kept
``--idempotency-window`` (the router's setting, a day by default); ``--no-markers`` leaves them out.

The caps and retention are the router's defaults (``DeferralSettings``) unless given. ``--json``
writes the samples to a file. Exit status 1 when the deferral keys' memory in the second half
of the run exceeds the sum of the tenants' ``max_bytes`` (it is not bounded by the caps).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.deferral.queue import (  # noqa: E402
    USAGE,
    Cancelled,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    OverCap,
)
from scheduler.ledger.ledger import ENGINE_COUNTED, ENTRY_TTL_S, entry_key  # noqa: E402
from scheduler.server.audit import AUDIT_MAXLEN  # noqa: E402
from scheduler.server.deferral_settings import DeferralSettings  # noqa: E402
from scheduler.state import keys  # noqa: E402
from scheduler.state.redis_store import RedisStore, delete_namespace  # noqa: E402

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the simulated start
HOUR_S = 3600.0
BATCH_TENANTS = 9
# What the router stores for a request besides its prompt: a DeferResponse (the decision, its
# ranked candidates) and an answer's decision and receipt; sizes of the router's own messages.
ACK_BYTES = 1500
ANSWER_OVERHEAD_BYTES = 2000
# Concurrent store calls the driver keeps in flight (one connection each).
IN_FLIGHT = 64


@dataclass
class Sample:
    hour: float
    submitted: int
    refused: int
    answered: int
    deleted: int
    held: int
    keys: dict[str, int]
    memory: dict[str, int]  # MEMORY USAGE by key kind, bytes
    deferral_bytes: int  # MEMORY USAGE of the deferral's keys
    marker_bytes: int  # of the ledger's and audit's keys
    accounted_bytes: int  # what the queue counts against the caps
    flood_bytes: int  # of which the flooding tenant's
    used_memory: int  # INFO memory: this whole Redis
    real_s: float
    lag_s: float  # the driver's largest lag behind the pace so far, simulated seconds

    def line(self) -> str:
        return (f"{self.hour:7.1f} h  submitted {self.submitted:>10,}  refused {self.refused:>10,}  "
                f"answered {self.answered:>9,}  deleted {self.deleted:>9,}  held {self.held:>7,}  "
                f"deferral {self.deferral_bytes / 2**20:8.1f} MiB (accounted {self.accounted_bytes / 2**20:7.1f}, "
                f"flood {self.flood_bytes / 2**20:6.1f})  "
                f"markers {self.marker_bytes / 2**20:8.1f} MiB ({self.keys.get('ledger_entry', 0):,} ledger, "
                f"{self.keys.get('audit_once', 0):,} audit)  redis used {self.used_memory / 2**20:8.1f} MiB  "
                f"[{self.real_s:6.0f} s, lag {self.lag_s:4.0f} s]")


@dataclass
class Soak:
    args: argparse.Namespace
    store: RedisStore
    client: aioredis.Redis
    namespace: str
    settings: DeferralSettings
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    # (simulated time, tenant, request id): a client fetching and deleting its answer then
    deletions: list[tuple[float, str, str]] = field(default_factory=list)
    clock: float = T0
    # The largest lag behind the pace, simulated seconds.
    lag_s: float = 0.0
    tenants: list[str] = field(default_factory=lambda: ["flood", *(f"batch-{k}" for k in range(BATCH_TENANTS))])
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        settings = self.settings
        # A claim lives 10 real seconds at least: a run that waits on a busy loop keeps it.
        claim_ttl_s = max(settings.claim_ttl_s, 10.0 * self.args.speed)
        self.queue = DeferralQueue(self.store, claim_ttl_s=claim_ttl_s, result_ttl_s=settings.result_ttl_s,
                                   grace_s=settings.grace_s, max_held=settings.max_held, max_bytes=settings.max_bytes,
                                   clock=self.now, speed=self.args.speed)
        # One of each: a prompt's bytes need not be new for every request.
        self.flood_prompt = b"p" * self.args.flood_prompt_bytes
        self.batch_prompt = b"p" * 1024
        self.ack = b"k" * ACK_BYTES
        self.answer = b"a" * (1024 + ANSWER_OVERHEAD_BYTES)

    def now(self) -> float:
        return self.clock

    def request(self, now: float, serial: int) -> HeldRequest:
        rng = self.rng
        if serial % 2 == 0:
            deadline, release = now + 20 * HOUR_S, now + 19 * HOUR_S
            return HeldRequest(f"f{serial}", "flood", now, deadline, release, "window", "held for a window",
                               region="eu-north", payload=self.flood_prompt)
        deadline = now + rng.uniform(600.0, 3600.0)
        release = rng.uniform(now, deadline - 300.0)
        return HeldRequest(f"b{serial}", f"batch-{serial % BATCH_TENANTS}", now, deadline, release, "window",
                           "held for a window", region="eu-north", payload=self.batch_prompt)

    async def run(self, item: HeldRequest) -> bytes:
        """A release: the router's bookkeeping per run, and the answer it stores."""
        decision_id = uuid.uuid4().hex
        if self.args.markers:
            speed = self.args.speed
            month = time.strftime("%Y-%m", time.gmtime(self.now()))
            await self.store.ledger_add(keys.ledger(item.tenant, month),
                                        {"eu-north|llama-3.1-8b|requests": 1.0, "eu-north|llama-3.1-8b|energy_j": 12.5},
                                        entry_key(decision_id, "eu-north", "a100-chat"), self.args.idempotency_window / speed,
                                        ENGINE_COUNTED)
            entry = {"decision_id": decision_id, "request_id": item.request_id, "tenant": item.tenant,
                     "region": "eu-north", "pool": "a100-chat", "energy_j": "12.5", "carbon_g": "0.31",
                     "released_at": repr(self.now()), "deferral": f"{item.reason}: {item.detail}"}
            await self.store.xadd_once(keys.AUDIT, entry, AUDIT_MAXLEN, keys.audit_once(decision_id),
                                       self.args.idempotency_window / speed)
        self.counts["answered"] += 1
        if item.tenant != "flood" and self.rng.random() < 0.99:
            heapq.heappush(self.deletions, (self.now() + self.rng.uniform(60.0, 600.0), item.tenant, item.request_id))
        return self.answer

    async def submit(self, item: HeldRequest, gate: asyncio.Semaphore) -> None:
        async with gate:
            outcome = await self.queue.submit(item, self.ack)
        self.counts["submitted"] += 1
        if isinstance(outcome, OverCap | Cancelled):
            self.counts["refused"] += 1
            self.counts[f"refused {item.tenant.split('-')[0]}"] += 1

    async def delete(self, tenant: str, request_id: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            if await self.queue.answer(tenant, request_id) is not None:  # the client fetches it, then deletes it
                await self.queue.cancel(tenant, request_id, b"c" * 200)
                self.counts["deleted"] += 1

    async def sample(self, hour: float) -> Sample:
        """The namespace's keys by kind and their memory (a measurement: this lists keys)."""
        found: Counter[str] = Counter()
        memory: Counter[str] = Counter()
        batch: list[bytes] = []

        async def measure() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.memory_usage(key, samples=0)
                sizes = await pipe.execute()
            for key, size in zip(batch, sizes, strict=True):
                kind = key.decode().split(":")[2]
                found[kind] += 1
                memory[kind] += size or 0
            batch.clear()

        async for key in self.client.scan_iter(match=f"sched:{self.namespace}:*", count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                await measure()
        if batch:
            await measure()
        held = sum([await self.store.zcard(f"deferred_due:{tenant}") for tenant in self.tenants])
        by_tenant = dict(await self.store.zrange_by_score(USAGE))
        info = await self.client.info("memory")
        deferral = sum(size for kind, size in memory.items() if kind.startswith("deferred"))
        return Sample(hour=hour, submitted=self.counts["submitted"], refused=self.counts["refused"],
                      answered=self.counts["answered"], deleted=self.counts["deleted"], held=held,
                      keys=dict(found), memory=dict(memory), deferral_bytes=deferral,
                      marker_bytes=sum(memory.values()) - deferral, accounted_bytes=int(sum(by_tenant.values())),
                      flood_bytes=int(by_tenant.get("flood", 0)),
                      used_memory=int(info["used_memory"]), real_s=time.monotonic() - self.started,
                      lag_s=self.lag_s)

    async def drive(self) -> list[Sample]:
        args = self.args
        worker = DeferralWorker(self.queue, self.run, "soak", lambda item, error: b"failed",
                                max_running=args.max_running)
        gate = asyncio.Semaphore(IN_FLIGHT)
        steps = math.ceil(args.hours * HOUR_S / args.step)
        per_sample = max(1, round(args.sample_hours * HOUR_S / args.step))
        serial = 0
        samples = [await self.sample(0.0)]
        print(samples[-1].line(), flush=True)
        self.started = time.monotonic()
        for step in range(1, steps + 1):
            self.clock = now = T0 + step * args.step
            due = math.floor(step * args.step * args.rate)
            await asyncio.gather(*(self.submit(self.request(now, k), gate) for k in range(serial, due)))
            serial = due
            await worker.tick()
            deletions = []
            while self.deletions and self.deletions[0][0] <= now:
                _, tenant, request_id = heapq.heappop(self.deletions)
                deletions.append(self.delete(tenant, request_id, gate))
            await asyncio.gather(*deletions)
            ahead = step * args.step / args.speed - (time.monotonic() - self.started)
            if ahead > 0:
                await asyncio.sleep(ahead)
            else:
                self.lag_s = max(self.lag_s, -ahead * args.speed)
            if step % per_sample == 0 or step == steps:
                samples.append(await self.sample((now - T0) / HOUR_S))
                print(samples[-1].line(), flush=True)
        return samples


def bounded(samples: list[Sample], settings: DeferralSettings, tenants: int) -> bool:
    """Whether the deferral's memory in the second half stayed within the sum of the caps."""
    late = samples[len(samples) // 2:]
    return all(s.deferral_bytes <= tenants * settings.max_bytes for s in late)


async def main(args: argparse.Namespace) -> int:
    defaults = DeferralSettings()
    settings = DeferralSettings(max_held=args.max_held or defaults.max_held,
                                max_bytes=args.max_bytes or defaults.max_bytes,
                                result_ttl_s=args.result_ttl or defaults.result_ttl_s)
    namespace = f"soak-{uuid.uuid4().hex[:10]}"
    store = RedisStore.from_url(args.redis, namespace, timeout_s=30.0)
    client = aioredis.Redis.from_url(args.redis, socket_timeout=60)
    soak = Soak(args, store, client, namespace, settings, random.Random(args.seed))
    print(f"deferral soak: {args.hours:g} simulated h at {args.rate:g} deferrals/s, clock x{args.speed:g}, "
          f"namespace {namespace} on {args.redis}; caps {settings.max_held:,} held, {settings.max_bytes:,} bytes "
          f"per tenant; held prompt kept to deadline + {settings.grace_s:g} s, answer {settings.result_ttl_s:g} s; "
          f"markers {'on' if args.markers else 'off'}", flush=True)
    try:
        samples = await soak.drive()
    finally:
        await store.close()
        await client.aclose()
        await delete_namespace(args.redis, namespace)
    ok = bounded(samples, settings, 1 + BATCH_TENANTS)
    rate = soak.counts["submitted"] / max(1e-9, samples[-1].real_s)
    print(f"{soak.counts['submitted']:,} deferrals in {samples[-1].real_s:.0f} s real ({rate:,.0f}/s, largest lag "
          f"{soak.lag_s:.0f} simulated s), refused: "
          f"flood {soak.counts['refused flood']:,}, batch {soak.counts['refused batch']:,}; deferral memory "
          f"{'bounded' if ok else 'NOT bounded'} by the caps ({1 + BATCH_TENANTS} tenants x "
          f"{settings.max_bytes / 2**20:g} MiB)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"settings": {k: v for k, v in asdict(settings).items() if k != "stores"},
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "counts": dict(soak.counts), "bounded": ok, "lag_s": soak.lag_s,
                                         "samples": [asdict(s) for s in samples]}, indent=1))
    return 0 if ok else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/1")
    parser.add_argument("--hours", type=float, default=48.0, help="simulated hours (default 48)")
    parser.add_argument("--rate", type=float, default=100.0, help="deferrals per simulated second (default 100)")
    parser.add_argument("--speed", type=float, default=5.0,
                        help="simulated seconds per real second (default 5); too fast for the machine and the "
                             "driver lags (printed): lower it")
    parser.add_argument("--step", type=float, default=10.0, help="simulated seconds per step of the clock")
    parser.add_argument("--sample-hours", type=float, default=2.0, help="simulated hours between samples")
    parser.add_argument("--flood-prompt-bytes", type=int, default=200 * 1024)
    parser.add_argument("--max-held", type=int, default=0, help="per-tenant cap (default: the router's)")
    parser.add_argument("--max-bytes", type=int, default=0, help="per-tenant cap (default: the router's)")
    parser.add_argument("--result-ttl", type=float, default=0.0, help="answer TTL, s (default: the router's)")
    parser.add_argument("--max-running", type=int, default=256, help="releases one pass starts at most")
    parser.add_argument("--no-markers", dest="markers", action="store_false",
                        help="leave out the ledger's and audit's per-run markers")
    parser.add_argument("--idempotency-window", type=float, default=ENTRY_TTL_S, metavar="S",
                        help=f"how long the markers live, as the router's --idempotency-window (default "
                             f"{ENTRY_TTL_S:,.0f} s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the samples here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
