"""Thin servicers: convert, call the router's core (scheduler.server.core) or the store,
convert back.

Every Generate stream that relayed text books exactly one receipt (audit + ledger): complete,
or partial when the client cancels, a deadline passes or the region fails after the first
token (``docs/billing.md``; the core does the booking).

Failures are raised as ``scheduler.errors`` outcomes and mapped once by the edge
(``scheduler.server.edge``); nothing here builds a gRPC status.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from scheduler import errors
from scheduler.canary.runtime import CanaryRuntime
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.plugins.health import region_verdict
from scheduler.server import convert
from scheduler.server.canary import no_canary, status_to_proto
from scheduler.server.config_reload.reloader import ConfigReloader
from scheduler.server.core import RouterCore
from scheduler.server.deferral_api import CANCELLED, FAILED, Deferrals, replayed
from scheduler.server.edge import current_principal, current_trace
from scheduler.server.router_parts import Proxying, SharedState
from scheduler.state import keys
from scheduler.state.store import StateUnavailable
from scheduler.v1 import admin_pb2, admin_pb2_grpc, messages_pb2, router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# The kill switch's reason is logged and stored in the flags record: a sentence, not a payload.
MAX_REASON_CHARS = 500


class RouterServiceParts(Proxying, Protocol):
    # The deferral queue (None: this router does not run it; its calls are refused).
    deferrals: Deferrals | None


class GlobalRouterService(router_pb2_grpc.GlobalRouterServicer):
    def __init__(self, deps: RouterServiceParts) -> None:
        self.deps = deps
        self.core = RouterCore(deps)

    async def Route(self, request: messages_pb2.GenerateRequest, context: Context) -> router_pb2.RouteResponse:
        routed = self.core.route(current_principal(), request, current_trace())
        return routed.to_proto()

    async def Generate(
        self, request: messages_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[messages_pb2.GenerateResponse]:
        run = self.core.proxy(current_principal(), request, context.time_remaining(), current_trace())
        async with run:
            # The region request went out on entry; the decision message is built while it prefills.
            await asyncio.sleep(0)
            yield messages_pb2.GenerateResponse(
                decision=convert.decision_to_proto(run.decision, run.decision_id, run.incoming,
                                                   run.snapshot.config_version))
            async for delta in run:
                yield messages_pb2.GenerateResponse(
                    chunk=messages_pb2.TokenChunk(text=delta.text, finish_reason=delta.finish_reason))
        if run.receipt is not None:
            # After an early end the partial receipt goes first, while the stream can carry
            # it; the status (DEADLINE_EXCEEDED, UNAVAILABLE) follows.
            yield messages_pb2.GenerateResponse(receipt=convert.receipt_to_proto(run.receipt))
        if run.failure is not None:
            raise run.failure

    # --- deferral (docs/deferral.md; scheduler.server.deferral_api) ------------------------------

    def _deferrals(self) -> Deferrals:
        if self.deps.deferrals is None:
            raise errors.Unavailable("this router does not run the deferral queue", retryable=False)
        return self.deps.deferrals

    async def Defer(self, request: router_pb2.DeferRequest, context: Context) -> router_pb2.DeferResponse:
        return await self._deferrals().defer(current_principal(), request, current_trace())

    async def GetDeferred(self, request: router_pb2.GetDeferredRequest, context: Context) -> router_pb2.DeferredStatus:
        return await self._deferrals().status(current_principal(), request.request_id, request.tenant)

    async def CancelDeferred(self, request: router_pb2.CancelDeferredRequest,
                             context: Context) -> router_pb2.DeferredStatus:
        return await self._deferrals().cancel(current_principal(), request.request_id, request.tenant)

    async def WaitDeferred(
        self, request: router_pb2.GetDeferredRequest, context: Context
    ) -> AsyncIterator[messages_pb2.GenerateResponse]:
        """The answer as a Generate stream carries it, once done: the release's Decision, the
        text as one TokenChunk, the EnergyReceipt. A failed run ends with its own status, a
        cancelled request with FAILED_PRECONDITION."""
        status = await self._deferrals().wait(current_principal(), request.request_id, context.time_remaining(),
                                              request.tenant)
        if status.state in (FAILED, CANCELLED):
            raise replayed(status)
        yield messages_pb2.GenerateResponse(decision=status.decision)
        yield messages_pb2.GenerateResponse(chunk=messages_pb2.TokenChunk(text=status.text))
        if status.HasField("receipt"):
            yield messages_pb2.GenerateResponse(receipt=status.receipt)

    async def ListRegions(self, request: router_pb2.ListRegionsRequest, context: Context) -> router_pb2.ListRegionsResponse:
        snapshot = self.deps.refresher.current()
        return router_pb2.ListRegionsResponse(regions=convert.regions_to_proto(snapshot),
                                              snapshot_at_unix_s=snapshot.now)


class AdminParts(SharedState, Protocol):
    """What the admin service reads and sets: the flags and canary arm in the store, the
    snapshot they change, the config version, and what GetStatus reports."""

    refresher: SnapshotRefresher
    canary: CanaryRuntime | None
    # None: this router has no config files to reload (ReloadConfig says so).
    config: ConfigReloader | None
    host_id: str
    state_backend: str
    version: str
    active_streams: int


class RouterAdminService(admin_pb2_grpc.RouterAdminServicer):
    def __init__(self, deps: AdminParts) -> None:
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

    async def ReloadConfig(self, request: admin_pb2.ReloadConfigRequest,
                           context: Context) -> admin_pb2.ReloadConfigResponse:
        """Re-read, validate, apply and publish this router's config files (docs/hot-reload.md)."""
        reloader = self.deps.config
        if reloader is None:
            version = self.deps.refresher.current().config_version
            return admin_pb2.ReloadConfigResponse(ok=False, version=version, previous_version=version, problems=[
                admin_pb2.ConfigProblem(message="this router was started without config files to reload")])
        principal = current_principal()
        log.warning("config reload%s asked by %s", " (dry run)" if request.dry_run else "", principal.tenant)
        outcome = await reloader.reload("rpc", dry_run=request.dry_run)
        return outcome.to_proto()

    async def GetCanaryStatus(self, request: admin_pb2.GetCanaryStatusRequest,
                              context: Context) -> admin_pb2.GetCanaryStatusResponse:
        deps = self.deps
        policy = deps.refresher.builder.policy
        if deps.canary is None:
            return admin_pb2.GetCanaryStatusResponse(configured=False, policy=policy.name)
        return status_to_proto(deps.canary.status(policy))

    async def SetCanaryArm(self, request: admin_pb2.SetCanaryArmRequest,
                           context: Context) -> admin_pb2.SetCanaryArmResponse:
        deps = self.deps
        principal = current_principal()
        if len(request.reason) > MAX_REASON_CHARS:
            raise errors.InvalidRequest([errors.FieldViolation(
                "reason", f"at most {MAX_REASON_CHARS} characters (got {len(request.reason)})")])
        policy = deps.refresher.builder.policy
        canary = policy.canary
        if canary is None or deps.canary is None:
            raise no_canary(policy.name)
        updated_by = f"{principal.tenant}@{deps.host_id}"
        try:
            record = await deps.canary.set_arm(policy, request.enabled, request.reason, updated_by)
        except StateUnavailable as exc:
            raise errors.Unavailable(f"the state store is unreachable; the canary arm is unchanged: {exc}") from None
        # This router applies it at once; the others within their refresh interval.
        await deps.refresher.refresh()
        return admin_pb2.SetCanaryArmResponse(enabled=request.enabled, epoch=record.epoch,
                                              updated_at_unix_s=record.updated_at, updated_by=updated_by,
                                              policy=policy.name, arm=canary.arm)

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
        response.config_version = snapshot.config_version
        if deps.config is not None:
            response.config_version = deps.config.version.label
            response.config_rejected = sum(deps.config.rejected.values())
            response.config_last_rejection = deps.config.last_rejection
        return response
