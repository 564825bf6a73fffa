"""``AsyncSchedulerClient``: the asyncio SDK.

    async with AsyncSchedulerClient("router:50051", api_key=key, tls=True) as client:
        generation = client.generate("Hello", model="llama-3.1-8b", max_tokens=64)
        async for text in generation:
            print(text, end="")
        print(generation.receipt.energy_j, generation.decision.ranked[0].region)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from scheduler.client import direct
from scheduler.client.common import (
    RetryPolicy,
    StreamState,
    TlsConfig,
    auth_metadata,
    build_request,
    channel_options,
    resolve_tls,
    should_retry,
)
from scheduler.client.errors import SchedulerRpcError, from_rpc_error
from scheduler.v1 import admin_pb2, admin_pb2_grpc, messages_pb2, router_pb2, router_pb2_grpc


class _AsyncStream(StreamState):
    def __init__(self, client: AsyncSchedulerClient, request: messages_pb2.GenerateRequest,
                 timeout_s: float | None) -> None:
        super().__init__(request, timeout_s, client.retry)
        self._client = client

    def __aiter__(self) -> AsyncIterator[str]:
        raise NotImplementedError

    async def text(self) -> str:
        """Run to the end; the whole text."""
        return "".join([part async for part in self])


class AsyncGeneration(_AsyncStream):
    """Iterate the text; when the stream ends, ``decision`` and ``receipt`` are set.

    A call that fails with UNAVAILABLE before any text arrived is retried (same request id);
    once text has arrived, a failure is raised as it is.
    """


    async def __aiter__(self) -> AsyncIterator[str]:
        client = self._client
        while True:
            remaining = self.begin_attempt()
            received_text = False
            try:
                call = client._router.Generate(self.request, metadata=client._metadata, timeout=remaining)
                async for event in call:
                    text = self.take(event)
                    if text is not None:
                        received_text = True
                        yield text
                return
            except grpc.aio.AioRpcError as exc:
                try:
                    delay = self.retry_delay(from_rpc_error(exc), received_text)
                except SchedulerRpcError as error:
                    raise error from None
                await asyncio.sleep(delay)



class AsyncDirectGeneration(_AsyncStream):
    """Direct mode: ``Route`` (decision and tickets), then the text straight from the region,
    failing over down the targets before the first token; ``receipt`` is the region's."""


    async def __aiter__(self) -> AsyncIterator[str]:
        import httpx

        client = self._client
        remaining = self.begin_attempt()
        routed: router_pb2.RouteResponse = await client._unary(client._router.Route, self.request, remaining)
        self.decision = routed.decision
        if not routed.targets:
            raise direct.no_targets()
        failovers: list[messages_pb2.Failover] = []
        http = client._http_client()
        for target in routed.targets:
            stream = direct.DirectStream()
            received = False
            try:
                async with http.stream("POST", target.url, json=direct.region_body(self.request, target),
                                       headers=direct.headers(target), timeout=direct.timeout(self.remaining())) as reply:
                    if reply.status_code != 200:
                        raise direct.region_error(target, reply.status_code, await reply.aread())
                    async for data in reply.aiter_bytes():
                        text = stream.feed(data)
                        if text:
                            received = True
                            yield text
                if not stream.done:
                    raise direct.RegionFailed("stream ended without [DONE]")
                self.receipt = direct.receipt_proto(stream.receipt_claims, failovers)
                return
            except (direct.RegionFailed, httpx.HTTPError) as exc:
                failovers.append(direct.failover(target, exc, received))
        raise direct.exhausted(failovers)



class AsyncSchedulerClient:
    def __init__(self, target: str, *, api_key: str | None = None, tls: TlsConfig | bool | None = None,
                 timeout_s: float | None = 120.0, retry: RetryPolicy | None = None) -> None:
        tls_config = resolve_tls(tls)
        options = channel_options(tls_config)
        self._channel = (
            grpc.aio.secure_channel(target, tls_config.credentials(), options=options)
            if tls_config is not None else grpc.aio.insecure_channel(target, options=options)
        )
        self._router = router_pb2_grpc.GlobalRouterStub(self._channel)  # type: ignore[no-untyped-call]
        self._admin = admin_pb2_grpc.RouterAdminStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = auth_metadata(api_key)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._http: Any = None

    def generate(self, prompt: str | None = None, *, model: str, max_tokens: int,
                 timeout_s: float | None = None, mode: str = "proxy",
                 **options: Any) -> AsyncGeneration | AsyncDirectGeneration:
        """Stream a completion (``prompt``) or a chat (``messages=[{"role", "content"}]``).

        ``mode``: ``proxy`` (the default: the router streams the answer) or ``direct`` (the
        router decides and signs tickets; this client streams from the region over HTTP).
        ``options``: the keyword arguments of ``scheduler.client.common.build_request``.
        """
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        if mode == "direct":
            return AsyncDirectGeneration(self, request, timeout)
        if mode != "proxy":
            raise ValueError(f"mode must be 'proxy' or 'direct', got {mode!r}")
        return AsyncGeneration(self, request, timeout)

    def _http_client(self) -> Any:
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient()
        return self._http

    async def _unary(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        attempt = 0
        while True:
            try:
                return await method(request, metadata=self._metadata, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc)
                if not should_retry(error, attempt, self.retry):
                    raise error from None
                await asyncio.sleep(self.retry.backoff(attempt, error.retry_after_s))
                attempt += 1

    async def route(self, prompt: str | None = None, *, model: str, max_tokens: int,
                    timeout_s: float | None = None, **options: Any) -> messages_pb2.Decision:
        """Decide only: where the request would run, and why."""
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        response: router_pb2.RouteResponse = await self._unary(self._router.Route, request, timeout_s)
        return response.decision

    async def list_regions(self, timeout_s: float | None = None) -> list[messages_pb2.RegionInfo]:
        response: router_pb2.ListRegionsResponse = await self._unary(
            self._router.ListRegions, router_pb2.ListRegionsRequest(), timeout_s)
        return list(response.regions)

    async def set_energy_routing(self, enabled: bool, reason: str = "",
                                 timeout_s: float | None = None) -> admin_pb2.SetEnergyRoutingResponse:
        """The kill switch (admin key): every router follows within a second."""
        response: admin_pb2.SetEnergyRoutingResponse = await self._unary(
            self._admin.SetEnergyRouting, admin_pb2.SetEnergyRoutingRequest(enabled=enabled, reason=reason),
            timeout_s)
        return response

    async def status(self, timeout_s: float | None = None) -> admin_pb2.GetStatusResponse:
        response: admin_pb2.GetStatusResponse = await self._unary(
            self._admin.GetStatus, admin_pb2.GetStatusRequest(), timeout_s)
        return response

    async def close(self) -> None:
        await self._channel.close(None)
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSchedulerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
