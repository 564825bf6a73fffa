"""``scheduler bench sim-vs-real``: the same small trace through a real local vLLM CPU region
and through the simulator's replica, with step costs measured on the same engine settings.

1. Engines: the calibration runs on vLLM's ``AsyncLLM`` in this process, with the engine
   settings of a local region (``scheduler.region.app.EngineOptions``: the tiny model,
   max_model_len 2048, 32 sequences, eager mode, prefix caching, 64 MiB of KV cache): only
   there does vLLM report its own first-token time (its request stats), which separates a
   prefill's step time from the path around it, and prompts go in as token ids, so token counts
   are exact. The replay (``--through region``, the default) then goes to a local region as the
   router reaches one: a Ray Serve application (``RegionGateway`` + the vLLM replica) started
   here (``--endpoint URL``: one already running, e.g. from ``scheduler up``), over HTTP,
   ``POST /v1/completions`` with the prompt as token ids; ``--through engine`` replays on the
   in-process engine instead (no Ray: ~25 s and ~3 GB instead of ~75 s and ~7 GB more).
2. Calibration (synthetic requests, token ids from their own seed; none is in the replay):
   - prefill: one request at a time, prompt P, one output token; vLLM's request stats give the
     time from its engine core taking the request in to the first token, one prefill step:
         TTFT in the engine = t_step + t_token P + t_pair P (P + 1) / 2
   - decode: B requests of prompt P submitted together (B P within one step's token budget,
     so they prefill in one step and then decode in lockstep), N output tokens: from token a
     to token b (after every sequence has its first) there are b - a decode steps of B
     sequences, step j reading B (P + j) KV tokens:
         time = (b - a) (t_step + t_token B) + (t_kv + t_pair) B sum_j (P + j)
     (a run's total: single gaps between tokens jitter by milliseconds, as outputs reach this
     process in bursts).
   Least squares of these times on (1, tokens, KV tokens read, attention pairs), each
   observation weighted by 1 / its time and each kind (prefill, decode) given equal total
   weight, coefficients kept >= 0 (a negative one is fixed at 0 and the rest refitted). The
   "front end", the engine's latency outside its steps (the request reaching the engine core,
   the first token coming back to this process), is the median over the prefills of TTFT at
   the client - TTFT in the engine: a constant the simulator adds like the fleet simulator's
   RTT; through a region, it is measured again there: the median over the same prefill sweep,
   sent through the region, of TTFT at the client - the fitted prefill time (HTTP, Serve's
   proxy, the gateway and the replica's handle are in it). Energy is not measured on a CPU:
   the e_ coefficients are 0. The
   engine's own limits (max_num_seqs, max_num_batched_tokens, KV blocks x block size)
   complete the ``StepCosts``. Outputs are not detokenized (the engine's work is compared,
   not the tokenizer's, which would take CPU from the engine on a small host).
3. Replay: ``requests`` consecutive requests of the trace from a seeded start, token counts
   times ``token_scale`` (at least 1; the output at most max_model_len / 2 and the prompt cut
   so prompt + output < max_model_len), arrivals the trace's own gaps scaled to ``rate``
   requests/s; random token ids, so no prefix is shared. The engine gets each request at its
   arrival time (its real submit time is kept); the simulator
   (``scheduler.sim.replica.replay``) gets the same requests, front end after the same
   submit times, on the calibrated costs.
4. Report: TTFT (submit to first token) and completion (submit to last token) p50/p99 of
   both, side by side, TTFT also without the front end on the in-process engine (vLLM's own
   first-token time minus the time its engine core took the request in; in the simulator,
   minus the arrival at the replica; a region's HTTP stream does not carry it), and the
   fitted costs with their fit error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

import httpx
import numpy as np

from scheduler.energy.step import StepCosts
from scheduler.sim.replica import Seq, replay
from scheduler.sim.workload import load_trace
from scheduler.tickets import HEADER as TICKET_HEADER
from scheduler.tickets import RegionKeys, Ticket, TicketKeyRing, body_digest

# Token ids drawn for synthetic prompts: above the tokenizer's special tokens.
FIRST_TOKEN_ID = 10
THROUGH = {"region": "a local region (Ray Serve + vLLM, HTTP)", "engine": "the in-process engine"}
# The model a local region is asked for (its replica runs the tiny model under this name).
REGION_MODEL = "llama-3.1-8b"


def random_token_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]


@dataclass(frozen=True)
class Sweep:
    """The calibration requests: prefill lengths (each ``repeats`` times) and decode batches."""

    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 512, 768, 1024, 1536, 2000)
    repeats: int = 3
    # (batch, prompt tokens): batch x prompt within one step's token budget
    decode: tuple[tuple[int, int], ...] = (
        (1, 16), (1, 1024), (2, 512), (4, 16), (4, 256), (8, 64), (8, 256), (16, 16), (16, 128), (32, 16), (32, 64),
    )
    decode_tokens: int = 64


QUICK_SWEEP = Sweep(prefill_tokens=(64, 512, 1500), repeats=1, decode=((1, 64), (8, 64)), decode_tokens=12)


@dataclass(frozen=True)
class Replayed:
    """One replayed request: its tokens, and submit / first-token / last-token times [s]."""

    prompt: int
    output: int
    submitted: float
    first_token: float
    done: float
    # First token - the engine core taking the request in (vLLM's request stats); in the
    # simulator first token - arrival at the replica: TTFT without the front end.
    in_engine_ttft: float


@dataclass(frozen=True)
class Stream:
    """(perf_counter time, output tokens so far) at submission and at every output chunk (a
    chunk carries more than one token when this reader fell behind), and the TTFT vLLM
    measured inside the engine core [s]."""

    chunks: list[tuple[float, int]]
    in_engine_ttft: float


@dataclass(frozen=True)
class Fit:
    costs: StepCosts
    # The engine's front end: submission to the scheduler plus the first token back [s].
    frontend_s: float
    # sqrt(mean squared relative error) of the fitted times, per kind of observation
    rel_rms: dict[str, float]
    observations: dict[str, int]


def trace_requests(trace: str, requests: int, rate: float, token_scale: float, max_model_len: int,
                   seed: int) -> list[tuple[float, int, int]]:
    """(arrival offset [s], prompt, output) of ``requests`` consecutive trace rows (see the module doc)."""
    loaded = load_trace(trace)
    n = len(loaded.offsets_s)
    if requests < 1 or requests > n:
        raise ValueError(f"--requests must be between 1 and {n} (the trace's length), got {requests}")
    if rate <= 0 or token_scale <= 0:
        raise ValueError("--rate and --token-scale must be positive")
    first = random.Random(seed).randrange(n - requests + 1)
    rows = range(first, first + requests)
    offsets = loaded.offsets_s[first:first + requests] - loaded.offsets_s[first]
    span = float(offsets[-1]) * requests / (requests - 1) if requests > 1 and offsets[-1] > 0 else 1.0
    scale = (requests / span) / rate  # the segment's own rate -> ``rate``
    out: list[tuple[float, int, int]] = []
    for offset, row in zip(offsets, rows, strict=True):
        output = min(max(1, round(int(loaded.output_tokens[row]) * token_scale)), max_model_len // 2)
        prompt = min(max(1, round(int(loaded.prompt_tokens[row]) * token_scale)), max_model_len - 1 - output)
        out.append((float(offset) * scale, prompt, output))
    return out


def fit_step_costs(prefill: Sequence[tuple[int, float, float]], decode: Sequence[tuple[int, int, int, float]],
                   limits: StepCosts) -> Fit:
    """Least squares of the observed times on the step features (module doc).

    prefill: (prompt tokens, TTFT in the engine [s], TTFT at the client [s]); decode: (batch,
    steps, summed context of the batch over those steps, their time [s])."""
    if not prefill or not decode:
        raise ValueError("calibration needs both prefill and decode observations")
    rows: list[tuple[float, ...]] = []
    times: list[float] = []
    kinds: list[str] = []
    for p, seconds, _ in prefill:
        rows.append((1.0, p, 0.0, p * (p + 1) / 2))
        times.append(seconds)
        kinds.append("prefill")
    for batch, steps, context, seconds in decode:
        rows.append((steps, batch * steps, context, context))
        times.append(seconds)
        kinds.append("decode")
    x = np.asarray(rows)
    y = np.asarray(times)
    kind = np.asarray(kinds)
    counts = {k: int((kind == k).sum()) for k in ("prefill", "decode")}
    weight = np.asarray([1.0 / counts[k] for k in kinds]) ** 0.5 / y
    active = [True] * x.shape[1]
    while True:
        columns = [i for i, on in enumerate(active) if on]
        solution, *_ = np.linalg.lstsq(x[:, columns] * weight[:, None], y * weight, rcond=None)
        coef = np.zeros(x.shape[1])
        coef[columns] = solution
        negative = [i for i in columns if coef[i] < 0]
        if not negative:
            break
        active[min(negative, key=lambda i: coef[i])] = False
    rel = (x @ coef - y) / y
    rel_rms = {k: float(np.sqrt(np.mean(rel[kind == k] ** 2))) for k in counts}
    # Decode reads each token's KV and attends to it alike (kv = pairs there); the prefill
    # observations carry pairs alone, so t_pair comes from them and t_kv is the rest.
    costs = StepCosts(
        t_step=float(coef[0]), t_token=float(coef[1]), t_kv=float(coef[2]), t_pair=float(coef[3]),
        e_step=0.0, e_token=0.0, e_kv=0.0, e_pair=0.0, idle_w=0.0, max_num_seqs=limits.max_num_seqs,
        max_batched_tokens=limits.max_batched_tokens, kv_capacity_tokens=limits.kv_capacity_tokens,
    )
    frontend = float(np.median([client - engine for _, engine, client in prefill]))
    return Fit(costs, max(0.0, frontend), rel_rms, counts)


class Engine:
    """A vLLM CPU engine serving the tiny model with a local region's engine settings."""

    def __init__(self) -> None:
        from scheduler.region.app import EngineOptions, engine_env
        from scheduler.region.tiny_model import ensure_tiny_model

        options = EngineOptions()
        os.environ.update(engine_env(options))
        # vLLM logs to stdout at INFO by default; this command's output is its table or JSON.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.async_llm import AsyncLLM

        self._sampling = SamplingParams
        self._prompt = TokensPrompt
        args = AsyncEngineArgs(
            model=str(ensure_tiny_model()),
            max_model_len=options.max_model_len,
            max_num_seqs=options.max_num_seqs,
            enforce_eager=options.enforce_eager,
            enable_prefix_caching=True,
            kv_cache_memory_bytes=options.kv_cache_bytes,
            # Request stats on: they carry the engine core's own timestamps (its periodic
            # log lines are at INFO, below the level set above).
            disable_log_stats=False,
        )
        self.llm = AsyncLLM.from_engine_args(args)
        config = self.llm.vllm_config
        self.max_model_len = options.max_model_len
        self.vocab = int(config.model_config.get_vocab_size())
        self.limits = StepCosts(
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            max_num_seqs=int(config.scheduler_config.max_num_seqs),
            max_batched_tokens=int(config.scheduler_config.max_num_batched_tokens),
            kv_capacity_tokens=int(config.cache_config.num_gpu_blocks or 0) * int(config.cache_config.block_size),
        )
        self._ids = 0

    def close(self) -> None:
        self.llm.shutdown()
        # Dropped now: vLLM's __del__ shuts down again, and at interpreter exit that fails noisily.
        del self.llm

    async def generate(self, token_ids: list[int], output: int) -> Stream:
        """Submit now and read the whole stream."""
        self._ids += 1
        params = self._sampling(max_tokens=output, min_tokens=output, ignore_eos=True, temperature=0.0,
                                detokenize=False)
        chunks = [(time.perf_counter(), 0)]
        in_engine = math.nan
        async for out in self.llm.generate(self._prompt(prompt_token_ids=token_ids), params, f"r{self._ids}"):
            chunks.append((time.perf_counter(), len(out.outputs[0].token_ids)))
            stats = out.metrics
            if len(chunks) == 2 and stats is not None and stats.first_token_ts > 0:
                in_engine = stats.first_token_ts - stats.queued_ts
        return Stream(chunks, in_engine)

    def tokens(self, rng: random.Random, n: int) -> list[int]:
        return random_token_ids(rng, self.vocab, n)


class Target(Protocol):
    """What the replay runs on: the in-process engine or a region over HTTP."""

    def tokens(self, rng: random.Random, n: int) -> list[int]: ...

    async def generate(self, token_ids: list[int], output: int) -> Stream: ...


@dataclass
class RegionClient:
    """A local region's OpenAI API (``<endpoint>/v1/completions``), as the router calls it:
    with a dispatch ticket signed under ``keys`` for ``pool`` (None: the region runs without
    tickets)."""

    endpoint: str
    model: str
    vocab: int
    max_model_len: int
    keys: RegionKeys | None = None
    pool: str = ""
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=120.0))

    def _headers(self, body: dict[str, Any]) -> dict[str, str] | None:
        if self.keys is None:
            return None
        digest = body_digest(body)
        assert digest is not None
        ticket = Ticket(decision_id=uuid.uuid4().hex, request_id="sim-vs-real", tenant="sim-vs-real",
                        region=self.keys.region, pool=self.pool, model=self.model, max_tokens=body["max_tokens"],
                        prompt_tokens_max=digest[1], body_sha256=digest[0], expires_at=time.time() + 30.0)
        return {TICKET_HEADER: ticket.sign(self.keys)}

    def tokens(self, rng: random.Random, n: int) -> list[int]:
        return random_token_ids(rng, self.vocab, n)

    async def generate(self, token_ids: list[int], output: int) -> Stream:
        """Submit now and read the whole stream; one chunk per streamed choice."""
        body = {"model": self.model, "prompt": token_ids, "max_tokens": output, "min_tokens": output,
                "ignore_eos": True, "temperature": 0.0, "stream": True}
        headers = self._headers(body)
        chunks = [(time.perf_counter(), 0)]
        async with self.http.stream("POST", f"{self.endpoint}/v1/completions", json=body,
                                    headers=headers) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                raise RuntimeError(f"region {self.endpoint} answered {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                # Token chunks carry a choice; the final usage chunk has "choices":[].
                if line.startswith("data:") and '"choices":[{' in line:
                    chunks.append((time.perf_counter(), len(chunks)))
        if len(chunks) < 2:
            raise RuntimeError(f"region {self.endpoint} streamed no tokens")
        return Stream(chunks, math.nan)

    async def frontend_s(self, fit: Fit, sweep: Sweep, seed: int) -> float:
        """Median of (TTFT at the client - fitted prefill time) over the prefill sweep."""
        rng = random.Random(f"frontend:{seed}")
        await self.generate(self.tokens(rng, 32), 4)  # warm-up, not measured
        costs, gaps = fit.costs, []
        for p in sweep.prefill_tokens:
            p = min(p, self.max_model_len - 2)
            for _ in range(sweep.repeats):
                stream = await self.generate(self.tokens(rng, p), 1)
                step = costs.t_step + costs.t_token * p + costs.t_pair * p * (p + 1) / 2
                gaps.append(stream.chunks[1][0] - stream.chunks[0][0] - step)
        return max(0.0, float(np.median(gaps)))


@contextlib.asynccontextmanager
async def local_region(endpoint: str | None, model: str, engine: Engine,
                       ticket_keys: TicketKeyRing | None = None) -> AsyncIterator[RegionClient]:
    """``endpoint``'s region (tickets signed with ``ticket_keys`` for the region's first local
    pool), or one local region (Ray Serve + vLLM CPU) started and stopped here."""
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.region import DEFAULT_LOCAL_REGIONS
    from scheduler.region.app import local_pools
    from scheduler.region.stack import LocalStack, StackOptions

    stack = None
    if endpoint is None:
        stack = LocalStack(StackOptions(only=DEFAULT_LOCAL_REGIONS[:1], state_url="memory", dashboard=False,
                                        http_port=0, carbon=False))
        await stack.start()
        endpoint = stack.endpoint(DEFAULT_LOCAL_REGIONS[0])
        ticket_keys = stack.ticket_keys
    endpoint = endpoint.rstrip("/")
    name = endpoint.rsplit("/", 1)[-1]
    regions = {r.name: r for r in load_checked_fleet().regions}
    if name not in regions:
        raise ValueError(f"{endpoint}: the path should end in a region name (one of {', '.join(sorted(regions))})")
    pool = next(iter(local_pools(regions[name])))
    keys = ticket_keys.of(name) if ticket_keys is not None else None
    client = RegionClient(endpoint, model, engine.vocab, engine.max_model_len, keys, pool)
    try:
        yield client
    finally:
        await client.http.aclose()
        if stack is not None:
            await stack.stop()


async def calibrate(engine: Engine, sweep: Sweep, seed: int) -> Fit:
    rng = random.Random(f"calibration:{seed}")
    await engine.generate(engine.tokens(rng, 32), 4)  # warm-up, not measured
    longest = engine.max_model_len - 2
    prefill: list[tuple[int, float, float]] = []
    for p in sweep.prefill_tokens:
        for _ in range(sweep.repeats):
            stream = await engine.generate(engine.tokens(rng, min(p, longest)), 1)
            client = stream.chunks[1][0] - stream.chunks[0][0]
            if math.isfinite(stream.in_engine_ttft):
                prefill.append((min(p, longest), stream.in_engine_ttft, client))
    decode: list[tuple[int, int, int, float]] = []
    for batch, prompt in [config for config in sweep.decode for _ in range(sweep.repeats)]:
        batch = min(batch, engine.limits.max_num_seqs)
        streams = await asyncio.gather(*(engine.generate(engine.tokens(rng, prompt), sweep.decode_tokens)
                                         for _ in range(batch)))
        # From the first chunk after every sequence has its first token (all decode in lockstep
        # from there) to the last: tokens a .. b came from decode steps a .. b - 1, step j
        # reading a context of prompt + j per sequence. Single gaps jitter by milliseconds
        # (outputs reach this process in bursts); a run's total does not.
        all_decoding = max(s.chunks[1][0] for s in streams)
        chunks = [c for c in streams[0].chunks[1:] if c[0] >= all_decoding]
        (start, a), (end, b) = chunks[0], chunks[-1]
        if b > a:
            context = batch * sum(prompt + j for j in range(a, b))
            decode.append((batch, b - a, context, end - start))
    return fit_step_costs(prefill, decode, engine.limits)


async def replay_real(engine: Target, requests: Sequence[tuple[float, int, int]], seed: int) -> list[Replayed]:
    rng = random.Random(f"replay:{seed}")
    prompts = [engine.tokens(rng, prompt) for _, prompt, _ in requests]
    start = time.perf_counter() + 0.05

    async def one(i: int) -> Replayed:
        offset, prompt, output = requests[i]
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        stream = await engine.generate(prompts[i], output)
        times = stream.chunks
        return Replayed(prompt, output, times[0][0] - start, times[1][0] - start, times[-1][0] - start,
                        stream.in_engine_ttft)

    return list(await asyncio.gather(*(one(i) for i in range(len(requests)))))


def replay_sim(fit: Fit, real: Sequence[Replayed]) -> tuple[list[Replayed], float]:
    """The real requests through the simulated replica, each reaching it the fitted front-end
    time after its real submission (the counterpart of the fleet simulator's RTT), and the
    replica's busy share from the first submission to the last token."""
    seqs = [Seq(r.submitted + fit.frontend_s, r.prompt, r.output) for r in real]
    replica = replay(fit.costs, seqs)
    span = max(s.done for s in seqs) - min(r.submitted for r in real)
    runs = [Replayed(r.prompt, r.output, r.submitted, s.first_token, s.done, s.first_token - s.arrived)
            for r, s in zip(real, seqs, strict=True)]
    return runs, replica.busy_s / span if span > 0 else 0.0


def summary(runs: Sequence[Replayed]) -> dict[str, float]:
    ttft = np.asarray([r.first_token - r.submitted for r in runs]) * 1e3
    in_engine = np.asarray([r.in_engine_ttft for r in runs]) * 1e3
    done = np.asarray([r.done - r.submitted for r in runs]) * 1e3
    return {
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "in_engine_ttft_p50_ms": float(np.nanpercentile(in_engine, 50)) if np.isfinite(in_engine).any() else math.nan,
        "in_engine_ttft_p99_ms": float(np.nanpercentile(in_engine, 99)) if np.isfinite(in_engine).any() else math.nan,
        "done_p50_ms": float(np.percentile(done, 50)),
        "done_p99_ms": float(np.percentile(done, 99)),
    }


@dataclass(frozen=True)
class Comparison:
    scenario: dict[str, Any]
    fit: Fit
    real: dict[str, float]
    sim: dict[str, float]
    seconds: dict[str, float]

    def to_json(self) -> str:
        return json.dumps({
            "scenario": self.scenario,
            "step_costs": asdict(self.fit.costs),
            "frontend_ms": self.fit.frontend_s * 1e3,
            "fit_rel_rms": self.fit.rel_rms,
            "calibration_observations": self.fit.observations,
            "real": {k: v if math.isfinite(v) else None for k, v in self.real.items()},
            "sim": {k: v if math.isfinite(v) else None for k, v in self.sim.items()},
            "seconds": self.seconds,
        }, indent=2)

    def table(self) -> str:
        s, c = self.scenario, self.fit.costs
        lines = [
            f"sim vs real: {s['requests']} requests of {s['trace']} (tokens x {s['token_scale']}), "
            f"{s['rate']} req/s, through {THROUGH[s['through']]}, "
            f"the tiny model on vLLM CPU ({c.max_num_seqs} sequences, "
            f"{c.max_batched_tokens} tokens a step, {c.kv_capacity_tokens} KV tokens); "
            f"the simulated replica is busy {s['sim_busy_share'] * 100:.0f} % of the time",
            f"step costs fitted on {self.fit.observations['prefill']} prefills and "
            f"{self.fit.observations['decode']} decode steps: t_step {c.t_step * 1e3:.3f} ms, "
            f"t_token {c.t_token * 1e6:.2f} us, t_kv {c.t_kv * 1e9:.2f} ns, t_pair {c.t_pair * 1e9:.3f} ns, "
            f"front end {self.fit.frontend_s * 1e3:.2f} ms (fit error: prefill {self.fit.rel_rms['prefill'] * 100:.1f} %, decode "
            f"{self.fit.rel_rms['decode'] * 100:.1f} % rms)",
            "",
            f"{'':<20}{'real':>10}{'sim':>10}{'sim/real':>10}",
        ]
        for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
                           ("in_engine_ttft_p50_ms", "in-engine TTFT p50"), ("in_engine_ttft_p99_ms", "in-engine TTFT p99"),
                           ("done_p50_ms", "done p50"), ("done_p99_ms", "done p99")):
            real, sim = self.real[key], self.sim[key]
            if not math.isfinite(real):
                continue  # in-engine figures: a region's HTTP stream does not carry them
            lines.append(f"{label:<20}{real:>8.1f}ms{sim:>8.1f}ms{sim / real if real else math.nan:>10.2f}")
        return "\n".join(lines)


async def compare(trace: str, requests: int, rate: float, token_scale: float, seed: int, sweep: Sweep,
                  through: Literal["region", "engine"] = "region", endpoint: str | None = None,
                  model: str | None = None, ticket_keys: TicketKeyRing | None = None) -> Comparison:
    began = time.perf_counter()
    engine = Engine()
    try:
        started = time.perf_counter()
        work = trace_requests(trace, requests, rate, token_scale, engine.max_model_len, seed)
        fit = await calibrate(engine, sweep, seed)
        calibrated = time.perf_counter()
        if through == "engine":
            real = await replay_real(engine, work, seed)
    finally:
        engine.close()
    region_start = 0.0
    if through == "region":
        # One engine at a time: the calibration engine is gone before the region's starts.
        async with local_region(endpoint, model or REGION_MODEL, engine, ticket_keys) as region:
            region_start = time.perf_counter() - calibrated
            fit = replace(fit, frontend_s=await region.frontend_s(fit, sweep, seed))
            calibrated = time.perf_counter()
            real = await replay_real(region, work, seed)
    replayed = time.perf_counter()
    sim, busy = replay_sim(fit, real)
    scenario = {"trace": trace, "requests": requests, "rate": rate, "token_scale": token_scale, "seed": seed,
                "through": through, "prompt_tokens_mean": float(np.mean([r.prompt for r in real])),
                "output_tokens_mean": float(np.mean([r.output for r in real])), "sim_busy_share": busy}
    seconds = {"engine_start": started - began, "calibration": calibrated - started - region_start,
               "region_start": region_start, "replay": replayed - calibrated}
    return Comparison(scenario, fit, summary(real), summary(sim), seconds)
