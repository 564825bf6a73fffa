"""``SchedulerClient``: the blocking SDK (same calls as ``AsyncSchedulerClient``).

    with SchedulerClient("router:50051", api_key=key) as client:
        generation = client.generate("Hello", model="llama-3.1-8b", max_tokens=64)
        for text in generation:
            print(text, end="")
        print(generation.receipt.carbon_g)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
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
from scheduler.v1 import admin_pb2, admin_pb2_grpc, messages_pb2, router_pb2, router_pb2_grpc
from scheduler.wire.retry import RetryPolicy, retry_sync


class _Stream(StreamState):
    def __init__(self, client: SchedulerClient, request: messages_pb2.GenerateRequest,
                 timeout_s: float | None) -> None:
        super().__init__(request, timeout_s, client.retry)
        self._client = client

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError

    def text(self) -> str:
        """Run to the end; the whole text."""
        return "".join(self)


class Generation(_Stream):
    """Iterate the text; when the stream ends, ``decision`` and ``receipt`` are set.
    Retried on UNAVAILABLE before any text arrived (same request id)."""


    def __iter__(self) -> Iterator[str]:
        client = self._client
        while True:
            remaining = self.begin_attempt()
            received_text = False
            try:
                for event in client._generate_events(self.request, remaining):
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
                time.sleep(delay)



class DirectGeneration(_Stream):
    """Direct mode (see ``AsyncDirectGeneration``), blocking."""


    def __iter__(self) -> Iterator[str]:
        import httpx

        client = self._client
        remaining = self.begin_attempt()
        routed = client._route(self.request, remaining)
        self.decision = routed.decision
        if not routed.targets:
            raise direct.no_targets()
        failovers: list[messages_pb2.Failover] = []
        http = client._http_client()
        pending, rerouted = list(routed.targets), False
        while pending:
            target = pending.pop(0)
            if direct.expired(target) and not rerouted:
                # Its ticket lapsed while earlier targets hung (see AsyncDirectGeneration).
                rerouted = True
                routed = client._route(self.request, self.remaining())
                self.decision = routed.decision
                pending = direct.untried(routed.targets, failovers)
                continue
            stream = direct.DirectStream()
            received = False
            try:
                with http.stream("POST", target.url, json=direct.region_body(self.request, target, routed.decision),
                                 headers=direct.headers(target), timeout=direct.timeout(self.remaining())) as reply:
                    if reply.status_code != 200:
                        raise direct.region_error(target, reply.status_code, reply.read())
                    for data in reply.iter_bytes():
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



class SchedulerClient:
    """``http_url``: the router's HTTP front door; given, direct mode asks ``Route`` over it
    (see ``AsyncSchedulerClient``)."""

    def __init__(self, target: str, *, api_key: str | None = None, tls: TlsConfig | bool | None = None,
                 timeout_s: float | None = 120.0, retry: RetryPolicy | None = None,
                 http_url: str | None = None) -> None:
        tls_config = resolve_tls(tls)
        self._tls = tls_config
        self.http_url = http_url
        self._api_key = api_key
        options = channel_options(tls_config)
        self._channel = (
            grpc.secure_channel(target, tls_config.credentials(), options=options)
            if tls_config is not None else grpc.insecure_channel(target, options=options)
        )
        self._router = router_pb2_grpc.GlobalRouterStub(self._channel)  # type: ignore[no-untyped-call]
        self._admin = admin_pb2_grpc.RouterAdminStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = auth_metadata(api_key)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._http: Any = None

    def generate(self, prompt: str | None = None, *, model: str, max_tokens: int,
                 timeout_s: float | None = None, mode: str = "proxy",
                 **options: Any) -> Generation | DirectGeneration:
        """``mode``: ``proxy`` (default) or ``direct`` (see ``AsyncSchedulerClient.generate``)."""
        options.setdefault("decision_detail", "summary")
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        if mode == "direct":
            return DirectGeneration(self, request, timeout)
        if mode != "proxy":
            raise ValueError(f"mode must be 'proxy' or 'direct', got {mode!r}")
        return Generation(self, request, timeout)

    def _http_client(self) -> Any:
        import httpx

        if self._http is None:
            context = connect.ssl_context(self._tls)
            self._http = httpx.Client(verify=context) if context is not None else httpx.Client()
        return self._http

    def _generate_events(self, request: messages_pb2.GenerateRequest,
                         timeout_s: float | None) -> Iterator[messages_pb2.GenerateResponse]:
        """One Generate call's messages (see ``AsyncSchedulerClient._generate_events``)."""
        if self.http_url is None:
            call = self._router.Generate(request, metadata=self._metadata, timeout=timeout_s)
            try:
                yield from call
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None
            finally:
                call.cancel()
            return
        import httpx

        url, body, headers = connect.generate_call(self.http_url, request, self._api_key, timeout_s)
        events = connect.GenerateEvents()
        timeout = httpx.Timeout(connect.read_timeout_s(timeout_s), connect=2.0)
        try:
            with self._http_client().stream("POST", url, content=body, headers=headers, timeout=timeout) as reply:
                if reply.status_code != 200:
                    raise connect.connect_error(reply.status_code, reply.read())
                for data in reply.iter_bytes():
                    yield from events.feed(data)
            events.finish()
        except httpx.ConnectError as exc:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            raise DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, f"router at {self.http_url}: {exc}") \
                from None
        except httpx.HTTPError as exc:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None

    def _route(self, request: messages_pb2.GenerateRequest, timeout_s: float | None) -> router_pb2.RouteResponse:
        """``Route`` over HTTP (Connect) when the client has ``http_url``, else over gRPC."""
        if self.http_url is None:
            routed: router_pb2.RouteResponse = self._unary(self._router.Route, request, timeout_s)
            return routed
        import httpx

        timeout = timeout_s if timeout_s is not None else self.timeout_s
        url, body, headers = connect.route_call(self.http_url, request, self._api_key, timeout)

        def route_once() -> router_pb2.RouteResponse:
            try:
                answer = self._http_client().post(url, content=body, headers=headers, timeout=timeout)
            except httpx.HTTPError as exc:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"router at {self.http_url}: {exc}") from None
            return connect.route_answer(answer.status_code, answer.headers, answer.content)

        return retry_sync(route_once, self.retry, retryable, hint_s=retry_hint_s)

    def _unary(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        timeout = timeout_s if timeout_s is not None else self.timeout_s

        def call_once() -> Any:
            try:
                return method(request, metadata=self._metadata, timeout=timeout)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

        return retry_sync(call_once, self.retry, retryable, hint_s=retry_hint_s)

    def route(self, prompt: str | None = None, *, model: str, max_tokens: int,
              timeout_s: float | None = None, **options: Any) -> messages_pb2.Decision:
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        response: router_pb2.RouteResponse = self._unary(self._router.Route, request, timeout_s)
        return response.decision

    def defer(self, prompt: str | None = None, *, model: str, max_tokens: int, deadline_unix_s: float = 0.0,
              timeout_s: float | None = None, **options: Any) -> router_pb2.DeferResponse:
        """Hold a deferrable request for its lowest-carbon window (see ``AsyncSchedulerClient.defer``)."""
        options.setdefault("decision_detail", "summary")
        options.setdefault("workload_class", "deferrable")
        request = build_request(prompt=prompt, model=model, max_tokens=max_tokens, **options)
        response: router_pb2.DeferResponse = self._unary(self._router.Defer, defer_request(request, deadline_unix_s),
                                                         timeout_s)
        return response

    def get_deferred(self, request_id: str, timeout_s: float | None = None) -> router_pb2.DeferredStatus:
        """Where a deferred request stands (see ``AsyncSchedulerClient.get_deferred``)."""
        response: router_pb2.DeferredStatus = self._unary(
            self._router.GetDeferred, router_pb2.GetDeferredRequest(request_id=request_id), timeout_s)
        return response

    def cancel_deferred(self, request_id: str, timeout_s: float | None = None) -> router_pb2.DeferredStatus:
        """Drop a deferred request (see ``AsyncSchedulerClient.cancel_deferred``)."""
        response: router_pb2.DeferredStatus = self._unary(
            self._router.CancelDeferred, router_pb2.CancelDeferredRequest(request_id=request_id), timeout_s)
        return response

    def wait_deferred(self, request_id: str, timeout_s: float | None = None) -> DeferredAnswer:
        """The answer once done, waiting up to ``timeout_s`` (see ``AsyncSchedulerClient.wait_deferred``)."""
        state = wait_state(request_id, timeout_s if timeout_s is not None else self.timeout_s, self.retry)
        while True:
            remaining = state.begin_attempt()
            texts: list[str] = []
            call = self._router.WaitDeferred(router_pb2.GetDeferredRequest(request_id=request_id),
                                             metadata=self._metadata, timeout=remaining)
            try:
                for event in call:
                    text = state.take(event)
                    if text is not None:
                        texts.append(text)
                return DeferredAnswer(request_id, state.decision, "".join(texts), state.receipt)
            except grpc.RpcError as exc:
                # Reading an answer is safe to repeat: retried whatever arrived.
                try:
                    delay = state.retry_delay(from_rpc_error(exc), received_text=False)
                except SchedulerRpcError as error:
                    raise error from None
                time.sleep(delay)
            finally:
                call.cancel()

    def list_regions(self, timeout_s: float | None = None) -> list[messages_pb2.RegionInfo]:
        response: router_pb2.ListRegionsResponse = self._unary(
            self._router.ListRegions, router_pb2.ListRegionsRequest(), timeout_s)
        return list(response.regions)

    def set_energy_routing(self, enabled: bool, reason: str = "",
                           timeout_s: float | None = None) -> admin_pb2.SetEnergyRoutingResponse:
        response: admin_pb2.SetEnergyRoutingResponse = self._unary(
            self._admin.SetEnergyRouting, admin_pb2.SetEnergyRoutingRequest(enabled=enabled, reason=reason),
            timeout_s)
        return response

    def status(self, timeout_s: float | None = None) -> admin_pb2.GetStatusResponse:
        response: admin_pb2.GetStatusResponse = self._unary(
            self._admin.GetStatus, admin_pb2.GetStatusRequest(), timeout_s)
        return response

    def reload_config(self, dry_run: bool = False, timeout_s: float | None = None) -> admin_pb2.ReloadConfigResponse:
        """Have the router re-read, validate, apply and publish its config files (admin key)."""
        response: admin_pb2.ReloadConfigResponse = self._unary(
            self._admin.ReloadConfig, admin_pb2.ReloadConfigRequest(dry_run=dry_run), timeout_s)
        return response

    def close(self) -> None:
        self._channel.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
