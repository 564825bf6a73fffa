"""Thin servicers: convert, call the scheduler / dispatcher / store, convert back.

Every Generate stream that relayed text books exactly one receipt (audit + ledger): complete,
or partial when the client cancels, a deadline passes or the region fails after the first
token (``docs/billing.md``).

Failures are raised as ``scheduler.errors`` outcomes and mapped once by the edge
(``scheduler.server.edge``); nothing here builds a gRPC status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from scheduler import errors
from scheduler.plugins.filters.region_health import region_verdict
from scheduler.server import convert
from scheduler.server.auth import scope_jurisdictions
from scheduler.server.edge import current_principal
from scheduler.server.receipt import ReceiptInputs, build_receipt
from scheduler.state import keys
from scheduler.state.store import StateUnavailable
from scheduler.types import Decision, EnergyReceipt, FleetSnapshot
from scheduler.v1 import admin_pb2, admin_pb2_grpc, messages_pb2, router_pb2, router_pb2_grpc

if TYPE_CHECKING:
    from scheduler.server.app import RouterDeps

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# The kill switch's reason is logged and stored in the flags record: a sentence, not a payload.
MAX_REASON_CHARS = 500


def unschedulable(decision: Decision) -> errors.Unschedulable:
    rejections = tuple(
        errors.RejectionReason(f"{r.candidate.key}/{r.candidate.deployment.name}", r.plugin, r.reason)
        for r in decision.rejected
    )
    by_plugin = Counter(r.plugin for r in rejections)
    plugin = by_plugin.most_common(1)[0][0] if by_plugin else ""
    summary = ", ".join(f"{name}: {count}" for name, count in by_plugin.most_common())
    return errors.Unschedulable(
        f"no candidate satisfies the request's hard requirements ({len(rejections)} rejected; {summary})",
        plugin, rejections,
    )


class GlobalRouterService(router_pb2_grpc.GlobalRouterServicer):
    def __init__(self, deps: RouterDeps) -> None:
        self.deps = deps

    def _decide(self, request: messages_pb2.GenerateRequest) -> tuple[FleetSnapshot, convert.Incoming, Decision]:
        principal = current_principal()
        tenant = request.tenant or principal.tenant
        if tenant != principal.tenant and not principal.admin:
            raise errors.PermissionDenied(f"a key of tenant {principal.tenant!r} cannot act for {convert.show(tenant)}")
        snapshot = self.deps.refresher.current()
        incoming = convert.incoming(request, tenant, snapshot)
        # A key bound to jurisdictions narrows (or fills in) where the request may run.
        allowed = scope_jurisdictions(principal, sorted(incoming.request.allowed_jurisdictions))
        if frozenset(allowed) != incoming.request.allowed_jurisdictions:
            incoming = dataclasses.replace(incoming, request=dataclasses.replace(
                incoming.request, allowed_jurisdictions=frozenset(allowed)))
        decision = self.deps.scheduler.schedule(incoming.request, snapshot)
        self.deps.metrics.decision(decision)
        if not decision.schedulable:
            raise unschedulable(decision)
        # Route answers send the client there too (direct mode): both count as dispatched.
        self.deps.refresher.record_dispatch(snapshot, decision.ranked_candidates[0], incoming.request)
        return snapshot, incoming, decision

    async def Route(self, request: messages_pb2.GenerateRequest, context: Context) -> router_pb2.RouteResponse:
        snapshot, incoming, decision = self._decide(request)
        decision_id = uuid.uuid4().hex
        response = router_pb2.RouteResponse(decision=convert.decision_to_proto(decision, decision_id, incoming))
        issuer = self.deps.tickets
        if issuer is None:
            return response
        # Tickets let the client dispatch itself: the same admission as a Generate.
        for admit in self.deps.admission:
            admit(incoming.request)
        for candidate in decision.ranked_candidates[: self.deps.direct_targets]:
            ticket = issuer.issue(decision_id=decision_id, request=incoming.request, body=incoming.call.body,
                                  candidate=candidate, snapshot=snapshot, mode="direct")
            response.targets.append(router_pb2.DirectTarget(
                region=candidate.region.name, pool=candidate.pool.name, model=candidate.deployment.name,
                url=candidate.region.endpoint.rstrip("/") + incoming.call.path, ticket=ticket,
                expires_at_unix_s=issuer.clock() + issuer.ttl_s,
            ))
        return response

    async def Generate(
        self, request: messages_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[messages_pb2.GenerateResponse]:
        deps = self.deps
        started = deps.monotonic()
        snapshot, incoming, decision = self._decide(request)
        for admit in deps.admission:
            admit(incoming.request)
        decision_id = uuid.uuid4().hex
        remaining = context.time_remaining()
        tenant = incoming.request.tenant
        issuer = deps.tickets
        ticket_for = None if issuer is None else (
            lambda candidate: issuer.issue(decision_id=decision_id, request=incoming.request, body=incoming.call.body,
                                           candidate=candidate, snapshot=snapshot, mode="proxy"))
        client_deadline = None if remaining is None else started + remaining
        # The stream's deadline: the client's, capped by the router's max_stream_s.
        stream = deps.dispatcher.stream(decision, incoming.call, client_deadline,
                                        {"decision_id": decision_id, "tenant": tenant}, ticket_for)
        booked: list[EnergyReceipt] = []

        def book(end_reason: str) -> EnergyReceipt | None:
            """Build and book this stream's receipt once; None when no region answered (no text)."""
            candidate = stream.candidate if end_reason == "complete" else (
                stream.current if stream.first_text_at is not None else None)
            if booked or candidate is None:
                return None
            receipt = build_receipt(ReceiptInputs(
                decision_id=decision_id,
                request_id=incoming.request.request_id,
                tenant=tenant,
                candidate=candidate,
                snapshot=snapshot,
                fallbacks=decision.fallbacks,
                failovers=tuple(stream.failovers),
                prompt_tokens=incoming.request.prompt_tokens,
                cached_tokens=incoming.request.cached_tokens,
                usage=stream.usage,
                energy=stream.energy,
                ttft_ms=None if stream.first_text_at is None else (stream.first_text_at - started) * 1000,
                duration_ms=(deps.monotonic() - started) * 1000,
                relayed_events=stream.content_events,
                end_reason=end_reason,
            ))
            booked.append(receipt)
            deps.book(receipt)
            return receipt

        failure: errors.SchedulerError | None = None
        deps.active_streams += 1
        try:
            # The region request goes out first; the decision message is built while it prefills.
            stream.start()
            await asyncio.sleep(0)
            yield messages_pb2.GenerateResponse(decision=convert.decision_to_proto(decision, decision_id, incoming))
            end_reason = "complete"
            try:
                async for delta in stream:
                    yield messages_pb2.GenerateResponse(
                        chunk=messages_pb2.TokenChunk(text=delta.text, finish_reason=delta.finish_reason))
            except errors.DeadlineExceeded as exc:
                failure, end_reason = exc, "deadline"
            except errors.Unavailable as exc:
                if stream.first_text_at is None:
                    raise
                failure, end_reason = exc, "region-error"
            receipt = book(end_reason)
        except Exception:
            book("error")  # an unexpected failure after text went out is billed too
            raise
        finally:
            if not booked:
                # Cancelled (the client went away, its deadline passed, the router is stopping)
                # after text went out: the client cannot get a receipt any more, but the ledger
                # and the audit do. Booked before any await, so a stopping router's ledger
                # drains it.
                passed = client_deadline is not None and deps.monotonic() >= client_deadline
                book("deadline" if passed else "cancelled")
            deps.active_streams -= 1
            await stream.aclose()
        if stream.failovers:
            deps.metrics.inc("scheduler_router_failovers_total", amount=len(stream.failovers))
        if receipt is not None:
            # After an early end the partial receipt goes first, while the stream can carry
            # it; the status (DEADLINE_EXCEEDED, UNAVAILABLE) follows.
            yield messages_pb2.GenerateResponse(receipt=convert.receipt_to_proto(receipt))
        if failure is not None:
            raise failure

    async def ListRegions(self, request: router_pb2.ListRegionsRequest, context: Context) -> router_pb2.ListRegionsResponse:
        snapshot = self.deps.refresher.current()
        return router_pb2.ListRegionsResponse(regions=convert.regions_to_proto(snapshot),
                                              snapshot_at_unix_s=snapshot.now)


class RouterAdminService(admin_pb2_grpc.RouterAdminServicer):
    def __init__(self, deps: RouterDeps) -> None:
        self.deps = deps

    async def SetEnergyRouting(
        self, request: admin_pb2.SetEnergyRoutingRequest, context: Context
    ) -> admin_pb2.SetEnergyRoutingResponse:
        deps = self.deps
        principal = current_principal()
        if len(request.reason) > MAX_REASON_CHARS:
            raise errors.InvalidRequest([errors.FieldViolation(
                "reason", f"at most {MAX_REASON_CHARS} characters (got {len(request.reason)})")])
        updated_at = deps.clock()
        updated_by = f"{principal.tenant}@{deps.host_id}"
        flags = {"energy_routing": request.enabled, "updated_at": updated_at, "updated_by": updated_by}
        if request.reason:
            flags["reason"] = request.reason
        try:
            await deps.store.set(keys.FLAGS, json.dumps(flags).encode())
        except StateUnavailable as exc:
            raise errors.Unavailable(f"the state store is unreachable; energy routing unchanged: {exc}") from None
        log.warning("energy routing %s by %s (%s)", "ON" if request.enabled else "OFF", updated_by,
                    request.reason or "no reason given")
        # This router applies it at once; the others within their refresh interval.
        await deps.refresher.refresh()
        return admin_pb2.SetEnergyRoutingResponse(enabled=request.enabled, updated_at_unix_s=updated_at,
                                                  updated_by=updated_by)

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: Context) -> admin_pb2.GetStatusResponse:
        deps = self.deps
        snapshot = deps.refresher.current()
        status = deps.refresher.status
        max_carbon_age = snapshot.policy.max_age.carbon
        response = admin_pb2.GetStatusResponse(
            energy_routing=snapshot.energy_routing_enabled,
            policy=snapshot.policy.name,
            state_backend=deps.state_backend,
            namespace=deps.store.namespace,
            state_reachable=status.reachable,
            last_state_error=status.last_error,
            snapshot_at_unix_s=snapshot.now,
            regions=len(snapshot.regions),
            candidates=len(snapshot.candidates),
            # As routing judges them: while the store is down, last known state + own probes.
            healthy_regions=sum(1 for r in snapshot.regions if region_verdict(snapshot, r.name) is None),
            fresh_carbon_zones=sum(1 for s in snapshot.carbon.values() if snapshot.age(s.observed_at) <= max_carbon_age),
            active_streams=deps.active_streams,
            version=deps.version,
        )
        if status.last_success_at is not None:
            response.last_state_read_unix_s = status.last_success_at
        return response
