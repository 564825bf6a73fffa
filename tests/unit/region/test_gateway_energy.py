"""The gateway's own request path bills measured energy per replica and GPU: the real
``RegionGateway`` (without Ray) in front of a fake pool deployment of two replicas that
stream as ``RegionLLMServer`` does (its report first and last, vLLM's continuous usage on
every chunk), its NVML meter reading fake GPUs (the real ``NvmlMeter`` over the fake
library). Checked: the client sees neither the reports nor the usage it did not ask for;
every receipt is measured (rule "predicted-share-v1") at its own replica's batch; every
interval conserves the metered joules, and the bills plus the idle joules are all the GPUs
spent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.requests import Request

from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.gateway import GatewaySettings, PoolEngine, RegionGateway
from scheduler.region.replica_report import ReplicaReport, RunningIntegral
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml

POOL = "h200-long"
STEP_S = 0.01
WATTS = 400.0
# The gateway's default interval: against the counter's 0.1 s lag (nvml.READING_LAG_S) an
# interval of a few steps would leave the shares' half-width larger than the shares.
METER_INTERVAL_S = 0.2


@dataclass
class Method:
    """``handle.<method>`` as the gateway calls it: ``.remote(...)``."""

    call: Callable[..., Any]

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


def gateway_node() -> str:
    """The node the gateway's GPUs are on, as it finds it: "" outside Ray, this process's Ray node
    when the test session has Ray running (the serve integration tests' fixture)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


@dataclass
class FakeReplica:
    """One replica: its GPU, its running sequences and their integral, as it reports them."""

    name: str
    gpu: FakeGpu
    gpu_index: int
    integral: RunningIntegral = field(default_factory=RunningIntegral)
    spent_j: float = 0.0

    def report(self) -> list[Any]:
        at, running_s = self.integral.read()
        return [ReplicaReport(self.name, gateway_node(), (self.gpu_index,), self.integral.running, running_s,
                              at).as_item()]

    async def step(self) -> None:
        """One engine step: the GPU draws WATTS for it."""
        await asyncio.sleep(STEP_S)
        self.gpu.energy_mj += round(WATTS * STEP_S * 1000)
        self.spent_j += round(WATTS * STEP_S * 1000) / 1000


@dataclass
class FakePool:
    """A pool's deployment handle; each call goes to the replica ``route`` names."""

    replicas: list[FakeReplica]
    route: list[int]
    live_stats: Method = field(init=False)
    stream_completions: Method = field(init=False)

    def __post_init__(self) -> None:
        self.live_stats = Method(self._live_stats)
        self.stream_completions = Method(self._stream)

    def options(self, **_: Any) -> FakePool:
        return self

    async def _live_stats(self) -> dict[str, float]:
        return {"running": 0.0, "max_model_len": 2048.0}

    async def _stream(self, body: dict[str, Any], prefix_key: str | None = None) -> AsyncIterator[list[Any]]:
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        replica = self.replicas[self.route.pop(0)]
        yield replica.report()
        replica.integral.update(replica.integral.running + 1)
        prompt, tokens = 300, int(body["max_tokens"])
        for n in range(1, tokens + 1):
            await replica.step()
            chunk = {"id": "cmpl-1", "object": "text_completion", "model": "tiny-llama",
                     "choices": [{"index": 0, "text": " w", "finish_reason": None if n < tokens else "length"}],
                     "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}}
            yield [f"data: {json.dumps(chunk)}\n\n"]
        replica.integral.update(replica.integral.running - 1)
        usage = {"id": "cmpl-1", "object": "text_completion", "model": "tiny-llama", "choices": [],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens,
                           "prompt_tokens_details": {"cached_tokens": 0}}}
        yield [f"data: {json.dumps(usage)}\n\n", "data: [DONE]\n\n"]
        yield replica.report()


def completion_request(max_tokens: int, headers: Callable[[dict[str, Any]], dict[str, str]] | None = None,
                       ) -> Request:
    """A streamed completion for ``POOL``; ``headers``: those to send, made from the body (a ticket)."""
    payload = {"model": "llama-3.1-8b", "prompt": "Which hour is cleanest?", "max_tokens": max_tokens,
               "stream": True, "x_scheduler": {"pool": POOL}}
    sent = [(name.encode(), value.encode()) for name, value in (headers(payload) if headers else {}).items()]
    body = json.dumps(payload).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "", "headers": sent,
                    "query_string": b""}, receive)


async def relayed(gateway: Any, max_tokens: int,
                  headers: Callable[[dict[str, Any]], dict[str, str]] | None = None) -> list[dict[str, Any]]:
    response = await gateway(completion_request(max_tokens, headers))
    assert response.status_code == 200
    raw = b"".join([chunk async for chunk in response.body_iterator])
    return [json.loads(block.removeprefix("data: ")) for block in raw.decode().split("\n\n")
            if block and block != "data: [DONE]"]


async def relayed_request(gateway: Any, max_tokens: int,
                          headers: Callable[[dict[str, Any]], dict[str, str]] | None = None) -> dict[str, Any]:
    """The final event of one relayed stream (its usage and energy)."""
    return (await relayed(gateway, max_tokens, headers))[-1]


def test_receipts_are_measured_per_replica_and_the_gpus_joules_are_all_accounted_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeGpu(energy_mj=5_000_000, power_mw=int(WATTS * 1000)) for _ in range(2)]
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(gpus=gpus))
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: FakeNvml(library_found=False))
    region = next(r for r in load_checked_fleet().regions if r.name == "eu-north")
    replicas = [FakeReplica("LLMServer:h200-long#a", gpus[0], 0), FakeReplica("LLMServer:h200-long#b", gpus[1], 1)]
    pool = FakePool(replicas, route=[0, 0, 1])
    settings = GatewaySettings(region=region, pools={POOL: (PoolEngine("tiny-llama", 2048),)},
                               tickets="disabled", meter_interval_s=METER_INTERVAL_S)
    cls = RegionGateway.func_or_class  # type: ignore[attr-defined]

    async def run() -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
        gateway = cls.__new__(cls)
        await gateway.__init__({POOL: {"tiny-llama": pool}}, settings)
        await asyncio.sleep(METER_INTERVAL_S / 2)  # the meter's baseline
        streams = await asyncio.gather(relayed(gateway, 200), relayed(gateway, 200), relayed(gateway, 120))
        await asyncio.sleep(2 * METER_INTERVAL_S)  # the meter closes what is left
        energy = (await gateway(Request({"type": "http", "method": "GET", "path": "/energy", "root_path": "",
                                         "headers": [], "query_string": b""}))).body
        await gateway.__del__()

        class Stopped(cls):  # type: ignore[misc, valid-type]
            def __del__(self) -> None:  # torn down above
                pass

        gateway.__class__ = Stopped
        return streams, json.loads(energy)

    streams, energy = asyncio.run(run())
    finals = [stream[-1] for stream in streams]
    for stream in streams:
        assert all("x_replica" not in chunk and (chunk.get("usage") is None or not chunk["choices"]) for chunk in stream)
        assert sum(1 for chunk in stream if chunk["choices"]) == stream[-1]["usage"]["completion_tokens"]
    for final in finals:
        e = final["energy"]
        assert e["measurement_source"] == "nvml" and e["attribution_method"] == "predicted-share-v1"
        assert e["energy_j_low"] < e["energy_j"] < e["energy_j_high"] and 0.0 < e["confidence"] <= 1.0
        assert e["phases"]["prefill_j"] + e["phases"]["decode_j"] == pytest.approx(e["energy_j"])
    # Two requests together on replica a (batch about 2), one alone on b (batch 1).
    assert finals[0]["energy"]["batch_size"] == pytest.approx(2.0, rel=0.25)
    assert finals[2]["energy"]["batch_size"] == pytest.approx(1.0)
    # b's GPU ran only the third request: all of it is that request's while it ran, the model
    # playing no part in the split.
    print(f"\nspent a {replicas[0].spent_j:.2f} J, b {replicas[1].spent_j:.2f} J; billed "
          + "; ".join(f"{e['energy_j']:.1f} J [{e['energy_j_low']:.1f}, {e['energy_j_high']:.1f}] batch "
                      f"{e['batch_size']:.2f}" for e in (f["energy"] for f in finals))
          + f"; idle {energy['idle_j']}; {len(energy['intervals'])} intervals")
    assert finals[2]["energy"]["energy_j"] == pytest.approx(replicas[1].spent_j, abs=WATTS * STEP_S * 2)
    for record in energy["intervals"]:
        assert record["attributed_j"] + record["idle_j"] == pytest.approx(record["measured_j"], rel=1e-12)
    billed = sum(f["energy"]["energy_j"] for f in finals)
    assert billed + sum(energy["idle_j"].values()) == pytest.approx(replicas[0].spent_j + replicas[1].spent_j)
    assert energy["rule"] == "predicted-share-v1" and energy["attributed_j"] == pytest.approx(billed)
