"""``scheduler.region.vllm_scrape``: vLLM's Prometheus text parsed, and a plain vLLM region's live
state from its servers, served here by real HTTP servers on port 0 that answer ``/metrics`` and
``/v1/models`` in vLLM 0.32's format (the real server: tests/integration/serve/test_byo_vllm.py)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from scheduler.config.compile import compile_fleet
from scheduler.config.schema import RegionConfig
from scheduler.region.vllm_scrape import MetricsError, VllmRegionSource, engine_count, parse_metrics
from scheduler.server.stub_region import bind

pytestmark = pytest.mark.timeout(60)

# Lines of a vLLM 0.32 server's /metrics (tiny model, after one request), in its order.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-byo"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-byo"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-byo",reason="capacity"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-byo"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-byo"} 11.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-byo"} 1.7964411875773406e+09
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-byo"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="tiny-byo"} 11.0
vllm:generation_tokens_total{engine="0",model_name="tiny-byo"} 5.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-byo"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-byo"} 1.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny-byo"} 0.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="tiny-byo"} 1.0
http_request_duration_highr_seconds_bucket{le="0.01"} 1.0
"""


def test_vllm_metrics_are_summed_over_their_labels() -> None:
    parsed = parse_metrics(VLLM_METRICS)
    assert parsed["vllm:num_requests_running"] == 0.0
    assert parsed["vllm:prefix_cache_queries_total"] == 11.0
    assert parsed["vllm:request_success_total"] == 1.0  # stop + length + abort
    assert parsed["vllm:request_prompt_tokens_bucket"] == 1.0
    assert engine_count(VLLM_METRICS) == 1


@pytest.mark.parametrize(("text", "expected"), [
    ('m{a="x}y",b="say \\"hi\\""} 2\nm{a="z"} 3 1700000000000\n', {"m": 5.0}),
    ("m 1\nm NaN\nm +Inf\n", {"m": 1.0}),
    ("", {}),
], ids=["braces and quotes in labels, a timestamp", "not finite: left out", "empty"])
def test_label_values_and_odd_values(text: str, expected: dict[str, float]) -> None:
    assert parse_metrics(text) == expected


@pytest.mark.parametrize("text", ["<html>not metrics</html>", "m{a=\"x\"} many"], ids=["html", "not a number"])
def test_what_is_not_prometheus_text_is_refused(text: str) -> None:
    with pytest.raises(MetricsError):
        parse_metrics(text)


def metrics(running: float = 0, waiting: float = 0, kv: tuple[float, ...] = (0.0,), hits: float = 0,
            queries: float = 0, prompt: float = 0, finished: float = 0, model: str = "served-8b") -> str:
    """A vLLM server's /metrics with these values (one gauge sample per engine for ``kv``)."""
    lines = [f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}',
             f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}']
    lines += [f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="{model}"}} {v}' for i, v in enumerate(kv)]
    lines += [f'vllm:prefix_cache_hits_total{{engine="0",model_name="{model}"}} {hits}',
              f'vllm:prefix_cache_queries_total{{engine="0",model_name="{model}"}} {queries}',
              f'vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} {prompt}',
              f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{model}"}} {finished}']
    return "\n".join(lines) + "\n"


@dataclass
class Server:
    """A real HTTP server on port 0 answering /metrics and /v1/models with what the test sets."""

    metrics_text: str = field(default_factory=metrics)
    models: dict[str, int] = field(default_factory=lambda: {"served-8b": 4096})
    # As vLLM's --api-key: /v1 needs it, /metrics does not.
    api_key: str | None = None
    port: int = 0
    _server: object = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Server:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse
        from starlette.routing import Route

        async def metrics_page(request: Request) -> PlainTextResponse:
            return PlainTextResponse(self.metrics_text)

        async def models_page(request: Request) -> JSONResponse:
            if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return JSONResponse({"object": "list", "data": [
                {"id": name, "object": "model", "owned_by": "vllm", "max_model_len": limit}
                for name, limit in self.models.items()]})

        app = Starlette(routes=[Route("/metrics", metrics_page), Route("/v1/models", models_page)])
        sock = bind()
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self._server, self._task = server, asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True  # type: ignore[attr-defined]
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def region(pools: dict[str, list[str]], kind: str = "vllm", api_key_env: str | None = None) -> RegionConfig:
    return RegionConfig.model_validate({
        "name": "eu-byo", "kind": kind, "jurisdiction": "EU", "grid_zone": "SE", "pue": 1.2, "price_per_kwh": 0.1,
        "location": {"lat": 59.3, "lon": 18.1}, "endpoint": "http://127.0.0.1:1",
        "carbon": {"provider": "csv", "zone": "SE", "poll_interval_s": 300},
        "pools": [{"name": name, "gpu": "A100-80GB", "count": 8, "power_cap_w": 400,
                   "models": [{"name": "llama-3.1-8b", "max_context": 8192},
                              {"name": "llama-3.2-3b", "max_context": 8192}],
                   "vllm": {"urls": urls, "served_model_names": {"llama-3.1-8b": "served-8b"},
                            "api_key_env": api_key_env}}
                  for name, urls in pools.items()],
    })


@pytest.fixture
async def servers() -> AsyncIterator[list[Server]]:
    started = [await Server().start() for _ in range(2)]
    yield started
    for server in started:
        await server.stop()


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_pools_servers_are_summed_and_its_models_are_those_every_server_serves(
        servers: list[Server]) -> None:
    a, b = servers
    a.metrics_text = metrics(running=3, waiting=1, kv=(0.2, 0.4))  # two engines: 0.3
    b.metrics_text = metrics(running=2, waiting=4, kv=(0.5,))
    a.models = {"served-8b": 2048, "llama-3.2-3b": 8192}
    b.models = {"served-8b": 4096}
    async with httpx.AsyncClient() as client:
        state = await VllmRegionSource(compile_fleet((region({"a100-chat": [a.url, b.url]}),)).regions[0], client)()
    pool = state.pools["a100-chat"]
    assert state.healthy and state.region == "eu-byo"
    assert (pool.running, pool.queue_depth, pool.replicas) == (5, 5, 2)
    assert pool.kv_cache_usage == pytest.approx((0.3 + 0.5) / 2)
    # llama-3.2-3b runs on one server only (a request for it could reach the other): not published.
    assert pool.models == {"llama-3.1-8b": 2048}
    # Nothing is measured: the router prices the pool with the energy model.
    assert pool.gpu_power_w is None and pool.measured_j_per_token is None


async def test_rates_come_from_the_counters_growth_and_survive_a_restart(servers: list[Server]) -> None:
    server = servers[0]
    clock = Clock()
    server.metrics_text = metrics(hits=30, queries=100, prompt=1000, finished=10)
    async with httpx.AsyncClient() as client:
        source = VllmRegionSource(compile_fleet((region({"a100-chat": [server.url]}),)).regions[0], client, monotonic=clock)
        first = (await source()).pools["a100-chat"]
        # The first pass: the hit rate since the server started, no arrival rate yet.
        assert first.prefix_cache_hit_rate == pytest.approx(0.3)
        assert first.arrival_rate == 0.0 and first.prompt_tokens_rate == 0.0

        clock.now += 10.0
        server.metrics_text = metrics(running=2, waiting=1, hits=90, queries=200, prompt=3000, finished=15)
        second = (await source()).pools["a100-chat"]
        assert second.prefix_cache_hit_rate == pytest.approx(60 / 100)
        # Averaged over 10 s as the gateway averages: the first window weighs 1 - exp(-10 s / 10 s).
        weight = 1 - math.exp(-1.0)
        # 5 finished + 3 more in the engine in 10 s; 2,000 prompt tokens in 10 s.
        assert second.arrival_rate == pytest.approx(0.8 * weight)
        assert second.prompt_tokens_rate == pytest.approx(200 * weight)

        clock.now += 10.0
        # The server restarted: its counters start again from small values, and count from there.
        server.metrics_text = metrics(hits=5, queries=10, prompt=100, finished=1)
        third = (await source()).pools["a100-chat"]
        assert third.prefix_cache_hit_rate == pytest.approx(0.5)
        assert third.prompt_tokens_rate > 0 and third.arrival_rate >= 0

        clock.now += 10.0
        # No query in the pass: the last hit rate stands.
        fourth = (await source()).pools["a100-chat"]
        assert fourth.prefix_cache_hit_rate == pytest.approx(0.5)


async def test_servers_that_do_not_answer_as_vllm_are_left_out(servers: list[Server],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    a, b = servers
    b.metrics_text = "# HELP process_cpu_seconds_total\nprocess_cpu_seconds_total 12.0\n"  # not vLLM's
    async with httpx.AsyncClient() as client:
        config = region({"a100-chat": [a.url, b.url], "h100-chat": [b.url]})
        source = VllmRegionSource(compile_fleet((config,)).regions[0], client, timeout_s=0.5)
        for _ in range(3):
            state = await source()
            assert list(state.pools) == ["a100-chat"] and state.pools["a100-chat"].replicas == 1
        # Logged once, when it started failing (one server, though two pools list it), not on every pass.
        warned = [r.getMessage() for r in caplog.records if "not answering" in r.getMessage()]
        assert len(warned) == 1 and b.url in warned[0] and "vllm:num_requests_running" in warned[0]
        await a.stop()
        # No server answers: no pool is published and the region is unhealthy at once.
        down = await source()
        assert not down.healthy and not down.pools


async def test_the_servers_api_key_comes_from_the_environment(servers: list[Server],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    server = servers[0]
    server.api_key = "sk-byo"
    async with httpx.AsyncClient() as client:
        config = region({"a100-chat": [server.url]}, api_key_env="BYO_SCRAPE_KEY")
        source = VllmRegionSource(compile_fleet((config,)).regions[0], client)
        monkeypatch.delenv("BYO_SCRAPE_KEY", raising=False)
        assert not (await source()).pools
        monkeypatch.setenv("BYO_SCRAPE_KEY", "sk-wrong")
        assert not (await source()).pools  # 401 on /v1/models
        monkeypatch.setenv("BYO_SCRAPE_KEY", "sk-byo")
        assert (await source()).pools["a100-chat"].models == {"llama-3.1-8b": 4096}


def test_only_a_vllm_region_is_scraped() -> None:
    ray_region = region({"a100-chat": ["http://127.0.0.1:1"]}).model_dump(mode="json")
    ray_region["kind"] = "ray-serve"
    for pool in ray_region["pools"]:
        del pool["vllm"]
    with pytest.raises(ValueError, match="only a region of kind 'vllm' is scraped"):
        VllmRegionSource(compile_fleet((RegionConfig.model_validate(ray_region),)).regions[0], httpx.AsyncClient())
