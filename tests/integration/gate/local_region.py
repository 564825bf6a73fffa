"""A local region whose engines are cheap: the REAL ``RegionGateway`` (without Ray, as
tests/unit/region/test_gateway_energy.py runs it) served over HTTP on port 0 by uvicorn, in
front of one fake vLLM replica per pool (``FakeEngine``), its GPU read by the real
``NvmlMeter`` over the fake NVML library of tests/unit/region/fake_nvml.py, or by no meter.

Real: the gateway's request path, its ``InFlight`` accounts and per-GPU split of the metered
joules (rule predicted-share-v1), the energy object of its receipts (``energy_report``), its
live state, the SSE it streams, HTTP. Not real: the engine and the GPU. ``FakeEngine`` runs
continuous batching as vLLM does (waiting sequences join the running batch up to
``max_num_seqs`` at each step; each step decodes one token of every running sequence) and
streams as ``RegionLLMServer`` does (its report first and last, vLLM's continuous usage on
every chunk). Each step charges the GPU's energy counter

    step_j = E_STEP_J + E_SEQ_J x running + E_PREFILL_J x prompt tokens admitted in the step

(the weights read once per step, shared by the batch, as on a GPU), so energy per token
falls as the batch grows: a smaller ``max_num_seqs`` under concurrency costs more per token.

The region runs on its own thread and event loop (``with LocalRegion(...) as region``), so a
caller may block (``scheduler.cli.main``) while it serves; it stops when the block ends.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from starlette.requests import Request

from scheduler.config.schema import RegionConfig
from scheduler.energy import nvml
from scheduler.region import power_caps
from scheduler.region.gateway import GatewaySettings, PoolEngine, RegionGateway
from scheduler.region.replica_report import ReplicaReport, RunningIntegral
from scheduler.server.stub_region import bind
from scheduler.types import RegionLiveState
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml

STEP_S = 0.003
E_STEP_J = 1.2
E_SEQ_J = 0.015
E_PREFILL_J = 0.0004
IDLE_MW = 60_000
START_TIMEOUT_S = 20.0


@dataclass
class _Sequence:
    prompt_tokens: int
    max_tokens: int
    produced: int = 0
    tokens: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


@dataclass
class FakeEngine:
    """One replica of a pool: continuous batching up to ``max_num_seqs`` over one fake GPU."""

    name: str
    gpu: FakeGpu
    gpu_index: int
    max_num_seqs: int
    integral: RunningIntegral = field(default_factory=RunningIntegral)
    generated: int = 0
    prefilled: int = 0
    _waiting: collections.deque[_Sequence] = field(default_factory=collections.deque)
    _running: list[_Sequence] = field(default_factory=list)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def options(self, **_: Any) -> FakeEngine:
        return self

    @property
    def live_stats(self) -> _Remote:
        return _Remote(self._live_stats)

    @property
    def stream_completions(self) -> _Remote:
        return _Remote(self._stream)

    @property
    def stream_chat(self) -> _Remote:
        return _Remote(self._stream)

    async def _live_stats(self) -> dict[str, float]:
        return {"running": float(len(self._running)), "waiting": float(len(self._waiting)), "max_model_len": 8192.0,
                "generation_tokens_total": float(self.generated), "prompt_tokens_total": float(self.prefilled)}

    def _report(self) -> list[Any]:
        at, running_s = self.integral.read()
        return [ReplicaReport(self.name, "", (self.gpu_index,), self.integral.running, running_s, at).as_item()]

    async def _steps(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self.gpu.power_mw = IDLE_MW
                self._wake.clear()
                await self._wake.wait()
            admitted = 0
            while self._waiting and len(self._running) < self.max_num_seqs:
                sequence = self._waiting.popleft()
                self._running.append(sequence)
                admitted += sequence.prompt_tokens
            self.integral.update(len(self._running))
            await asyncio.sleep(STEP_S)
            step_j = E_STEP_J + E_SEQ_J * len(self._running) + E_PREFILL_J * admitted
            self.gpu.energy_mj += round(step_j * 1000)
            self.gpu.power_mw = round(step_j / STEP_S * 1000)
            self.prefilled += admitted
            for sequence in self._running:
                sequence.produced += 1
                sequence.tokens.put_nowait(sequence.produced)
            self.generated += len(self._running)
            self._running = [s for s in self._running if s.produced < s.max_tokens]
            self.integral.update(len(self._running))

    async def _stream(self, body: dict[str, Any], prefix_key: str | None = None) -> AsyncIterator[list[Any]]:
        if self._task is None:
            self._task = asyncio.create_task(self._steps())
        chat = "messages" in body
        text = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        sequence = _Sequence(prompt_tokens=max(1, len(text) // 4), max_tokens=int(body["max_tokens"]))
        yield self._report()
        self._waiting.append(sequence)
        self._wake.set()
        kind = "chat.completion.chunk" if chat else "text_completion"
        prompt = sequence.prompt_tokens
        while True:
            n = await sequence.tokens.get()
            last = n == sequence.max_tokens
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": " w"}} if chat else {"text": " w"})
            chunk = {"id": "gate-1", "object": kind, "model": "tiny-llama", "choices": [choice],
                     "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}}
            yield [f"data: {json.dumps(chunk)}\n\n"]
            if last:
                break
        usage = {"id": "gate-1", "object": kind, "model": "tiny-llama", "choices": [],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": sequence.max_tokens,
                           "total_tokens": prompt + sequence.max_tokens, "prompt_tokens_details": {"cached_tokens": 0}}}
        yield [f"data: {json.dumps(usage)}\n\n", "data: [DONE]\n\n"]
        yield self._report()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class _Remote:
    """``handle.<method>`` as the gateway calls it: ``.remote(...)``."""

    call: Any

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


class LocalRegion:
    """``region``'s ``pool`` served by the real gateway over one ``FakeEngine``; ``metered``:
    its GPU read through the fake NVML (receipts ``nvml``), else no meter (``model``)."""

    def __init__(self, region: RegionConfig, pool: str, *, max_num_seqs: int, metered: bool = True) -> None:
        self.region, self.pool, self.metered = region, pool, metered
        self.gpu = FakeGpu(energy_mj=1_000_000, power_mw=IDLE_MW)
        self.engine = FakeEngine(f"LLMServer:{pool}#0", self.gpu, 0, max_num_seqs)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gateway: Any = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"local-region-{region.name}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRegion:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError(f"local region {self.region.name} did not start in {START_TIMEOUT_S} s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)

    def live_state(self) -> RegionLiveState:
        """What the gateway publishes now (its ``live_state``, on its own loop)."""
        assert self._loop is not None
        state: RegionLiveState = asyncio.run_coroutine_threadsafe(self._gateway.live_state(), self._loop).result(10)
        return state

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the caller by __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        import uvicorn

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        library = FakeNvml(gpus=[self.gpu]) if self.metered else FakeNvml(library_found=False)
        settings = GatewaySettings(region=self.region, pools={self.pool: (PoolEngine("tiny-llama", 8192),)},
                                   tickets="disabled")
        cls = RegionGateway.func_or_class  # type: ignore[attr-defined]
        gateway = cls.__new__(cls)
        # NVML is opened by the gateway's constructor: its meter keeps this library; the power
        # capper finds none (it dry-runs).
        with mock.patch.object(nvml, "_load_pynvml", lambda: library), \
                mock.patch.object(power_caps, "_load_pynvml", lambda: FakeNvml(library_found=False)):
            await gateway.__init__({self.pool: {"tiny-llama": self.engine}}, settings)
        self._gateway = gateway

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            response = await gateway(Request(scope, receive))
            await response(scope, receive, send)

        sock = bind(port=0)
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and time.monotonic() < deadline:
            if serving.done():
                serving.result()  # raises why it stopped
            await asyncio.sleep(0.01)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.should_exit = True
            await serving
            await self.engine.stop()
            await gateway.__del__()

            class Stopped(cls):  # type: ignore[misc, valid-type]
                def __del__(self) -> None:  # torn down above
                    pass

            gateway.__class__ = Stopped
