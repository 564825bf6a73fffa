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

from scheduler.client import connect, direct
from scheduler.client.common import (
    DeferredAnswer,
    StreamState,
    TlsConfig,
    auth_metadata,
    build_request,
    channel_options,
    defer_request,
    resolve_tls,
    retry_hint_s,
    retryable,
    wait_state,
)
from scheduler.client.errors import DeadlineExceededError, SchedulerRpcError, UnavailableError, from_rpc_error
from scheduler.http.client import ConnectError, HttpClient, HttpError
from scheduler.v1 import admin_pb2, admin_pb2_grpc, messages_pb2, router_pb2, router_pb2_grpc
from scheduler.wire.retry import RetryPolicy, retry_async


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
                async for event in client._generate_events(self.request, remaining):
                    text = self.take(event)
                    if text is not None:
                        received_text = True
                        yield text
                return
            except SchedulerRpcError as error:
                try:
                    delay = self.retry_delay(error, received_text)
                except SchedulerRpcError:
                    raise error from None
                await asyncio.sleep(delay)



class AsyncDirectGeneration(_AsyncStream):
    """Direct mode: ``Route`` (decision and tickets; over the router's HTTP front door when the
    client has its address, else gRPC), then the text straight from the region, failing over
    down the targets before the first token; ``receipt`` is the region's."""


    async def __aiter__(self) -> AsyncIterator[str]:
        client = self._client
        remaining = self.begin_attempt()
        routed = await client._route(self.request, remaining)
        self.decision = routed.decision
        if not routed.targets:
            raise direct.no_targets()
        failovers: list[messages_pb2.Failover] = []
        http = client._lean_http()
        pending, rerouted = list(routed.targets), False
        while pending:
            target = pending.pop(0)
            if direct.expired(target) and not rerouted:
                # Its ticket lapsed while earlier targets hung: a fresh decision, once, without
                # the regions that failed.
                rerouted = True
                routed = await client._route(self.request, self.remaining())
                self.decision = routed.decision
                pending = direct.untried(routed.targets, failovers)
                continue
            stream = direct.DirectStream()
            received = False
            read_s = direct.read_timeout_s(self.remaining())
            try:
                async with http.stream("POST", target.url, body=direct.region_payload(self.request, target, routed.decision),
                                       headers=direct.headers(target), connect_timeout_s=min(2.0, read_s),
                                       read_timeout_s=read_s) as reply:
                    if reply.status != 200:
                        raise direct.region_error(target, reply.status, await reply.read())
                    async for data in reply.chunks():
                        text = stream.feed(data)
                        if text:
                            received = True
                            yield text
                if not stream.done:
                    raise direct.RegionFailed("stream ended without [DONE]")
                self.receipt = direct.receipt_proto(stream.receipt_claims, failovers)
                return
            except (direct.RegionFailed, HttpError) as exc:
                failovers.append(direct.failover(target, exc, received))
        raise direct.exhausted(failovers)



class AsyncSchedulerClient:
    """``http_url``: the router's HTTP front door (``scheduler router --http-port``, e.g.
    ``http://router:8080``); given, direct mode asks ``Route`` over it, which costs the router
    much less than a gRPC call. TLS settings apply to it too when it is ``https``."""

    def __init__(self, target: str, *, api_key: str | None = None, tls: TlsConfig | bool | None = None,
                 timeout_s: float | None = 120.0, retry: RetryPolicy | None = None,
                 http_url: str | None = None) -> None:
        tls_config = resolve_tls(tls)
        self._tls = tls_config
        self.http_url = http_url
        self._api_key = api_key
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
        self._lean: HttpClient | None = None

    def generate(self, prompt: str | None = None, *, model: str, max_tokens: int,
                 timeout_s: float | None = None, mode: str = "proxy",
                 **options: Any) -> AsyncGeneration | AsyncDirectGeneration:
        """Stream a completion (``prompt``) or a chat (``messages=[{"role", "content"}]``).

        ``mode``: ``proxy`` (the default: the router streams the answer) or ``direct`` (the
        router decides and signs tickets; this client streams from the region over HTTP).
        ``options``: the keyword arguments of ``scheduler.client.common.build_request``; the
        decision comes as a summary (the chosen candidate) unless ``decision_detail="full"``.
        """
        options.setdefault("decision_detail", "summary")
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        if mode == "direct":
            return AsyncDirectGeneration(self, request, timeout)
        if mode != "proxy":
            raise ValueError(f"mode must be 'proxy' or 'direct', got {mode!r}")
        return AsyncGeneration(self, request, timeout)

    def _lean_http(self) -> HttpClient:
        if self._lean is None:
            self._lean = HttpClient(ssl_context=connect.ssl_context(self._tls), user_agent="carbon-scheduler-sdk")
        return self._lean

    async def _generate_events(self, request: messages_pb2.GenerateRequest,
                               timeout_s: float | None) -> AsyncIterator[messages_pb2.GenerateResponse]:
        """One Generate call's messages: over HTTP (Connect streaming) when the client has
        ``http_url``, else over gRPC; a failure as the typed ``SchedulerRpcError``."""
        if self.http_url is None:
            call = self._router.Generate(request, metadata=self._metadata, timeout=timeout_s)
            try:
                async for event in call:
                    yield event
            except grpc.aio.AioRpcError as exc:
                raise from_rpc_error(exc) from None
            return
        url, body, headers = connect.generate_call(self.http_url, request, self._api_key, timeout_s)
        events = connect.GenerateEvents()
        try:
            # The router ends the stream at the deadline; the read limit only catches a router gone silent.
            async with self._lean_http().stream("POST", url, body=body, headers=headers,
                                                read_timeout_s=connect.read_timeout_s(timeout_s)) as reply:
                if reply.status != 200:
                    raise connect.connect_error(reply.status, await reply.read())
                async for data in reply.chunks():
                    for event in events.feed(data):
                        yield event
            events.finish()
        except ConnectError as exc:  # a connect timeout included: the router is not reachable
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None
        except TimeoutError as exc:
            raise DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, f"router at {self.http_url}: {exc}") \
                from None
        except HttpError as exc:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None

    async def _route(self, request: messages_pb2.GenerateRequest, timeout_s: float | None) -> router_pb2.RouteResponse:
        """``Route`` over HTTP (Connect) when the client has ``http_url``, else over gRPC."""
        if self.http_url is None:
            routed: router_pb2.RouteResponse = await self._unary(self._router.Route, request, timeout_s)
            return routed
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        url, body, headers = connect.route_call(self.http_url, request, self._api_key, timeout)
        http = self._lean_http()

        async def route_once() -> router_pb2.RouteResponse:
            try:
                status, answer_headers, answer = await http.request(
                    "POST", url, body=body, headers=headers, read_timeout_s=timeout or 60.0)
            except HttpError as exc:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None
            return connect.route_answer(status, answer_headers, answer)

        return await retry_async(route_once, self.retry, retryable, hint_s=retry_hint_s)

    async def _unary(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        timeout = timeout_s if timeout_s is not None else self.timeout_s

        async def call_once() -> Any:
            try:
                return await method(request, metadata=self._metadata, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                raise from_rpc_error(exc) from None

        return await retry_async(call_once, self.retry, retryable, hint_s=retry_hint_s)

    async def route(self, prompt: str | None = None, *, model: str, max_tokens: int,
                    timeout_s: float | None = None, **options: Any) -> messages_pb2.Decision:
        """Decide only: where the request would run, and why."""
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        response: router_pb2.RouteResponse = await self._unary(self._router.Route, request, timeout_s)
        return response.decision

    async def defer(self, prompt: str | None = None, *, model: str, max_tokens: int, deadline_unix_s: float = 0.0,
                    timeout_s: float | None = None, **options: Any) -> router_pb2.DeferResponse:
        """Hold a deferrable request until the lowest-carbon window before ``deadline_unix_s``
        (0: the policy's deferrable TTFT SLO from now); the answer says when it is released and
        why (docs/deferral.md). Fetch it with ``get_deferred`` or ``wait_deferred``.

        ``options``: those of ``generate``; ``workload_class`` is ``deferrable``, and the
        ``request_id`` (made here when not given) is the idempotency key: a retry after
        UNAVAILABLE, here or by the caller with the same id, gets the first submission's answer.
        """
        options.setdefault("decision_detail", "summary")
        options.setdefault("workload_class", "deferrable")
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        response: router_pb2.DeferResponse = await self._unary(
            self._router.Defer, defer_request(request, deadline_unix_s), timeout_s)
        return response

    async def get_deferred(self, request_id: str, timeout_s: float | None = None) -> router_pb2.DeferredStatus:
        """Where a deferred request stands (held, running, done, failed, cancelled);
        ``NotFoundError`` for an id this key's tenant did not submit, or whose answer expired (the
        router's ``--deferral-result-ttl``, 1 day by default)."""
        response: router_pb2.DeferredStatus = await self._unary(
            self._router.GetDeferred, router_pb2.GetDeferredRequest(request_id=request_id), timeout_s)
        return response

    async def cancel_deferred(self, request_id: str, timeout_s: float | None = None) -> router_pb2.DeferredStatus:
        """Drop a deferred request: held, it never runs; answered, its answer is deleted. Its
        status (``cancelled``); ``NotFoundError`` for an id this key's tenant did not submit."""
        response: router_pb2.DeferredStatus = await self._unary(
            self._router.CancelDeferred, router_pb2.CancelDeferredRequest(request_id=request_id), timeout_s)
        return response

    async def wait_deferred(self, request_id: str, timeout_s: float | None = None) -> DeferredAnswer:
        """The answer of a deferred request once it is done, waiting up to ``timeout_s`` (default:
        the client's): ``DeadlineExceededError`` when it is still held or running then; a failed
        run raises its own error (e.g. ``UnavailableError``)."""
        state = wait_state(request_id, timeout_s if timeout_s is not None else self.timeout_s, self.retry)
        while True:
            remaining = state.begin_attempt()
            texts: list[str] = []
            try:
                call = self._router.WaitDeferred(router_pb2.GetDeferredRequest(request_id=request_id),
                                                 metadata=self._metadata, timeout=remaining)
                async for event in call:
                    text = state.take(event)
                    if text is not None:
                        texts.append(text)
                return DeferredAnswer(request_id, state.decision, "".join(texts), state.receipt)
            except grpc.aio.AioRpcError as exc:
                # Reading an answer is safe to repeat: retried whatever arrived.
                try:
                    delay = state.retry_delay(from_rpc_error(exc), received_text=False)
                except SchedulerRpcError as error:
                    raise error from None
                await asyncio.sleep(delay)

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

    async def reload_config(self, dry_run: bool = False,
                            timeout_s: float | None = None) -> admin_pb2.ReloadConfigResponse:
        """Have the router re-read, validate, apply and publish its config files (admin key);
        ``ok`` false: nothing changed, ``problems`` says why (docs/hot-reload.md)."""
        response: admin_pb2.ReloadConfigResponse = await self._unary(
            self._admin.ReloadConfig, admin_pb2.ReloadConfigRequest(dry_run=dry_run), timeout_s)
        return response

    async def close(self) -> None:
        await self._channel.close(None)
        if self._lean is not None:
            await self._lean.aclose()

    async def __aenter__(self) -> AsyncSchedulerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
