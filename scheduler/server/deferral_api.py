"""Deferral in the router (docs/deferral.md): ``Defer`` holds a deferrable request in the
durable queue (``scheduler.deferral.queue``) until the lowest-carbon window of its grid's
forecast before its deadline; the release loop runs it through the same core path as
``Generate``; ``GetDeferred`` and ``WaitDeferred`` read its answer from the store, so the router
that answers need not be the one that ran it.

Submit (``Deferrals.defer``):

    deadline = the request's, or now + the policy's deferrable TTFT budget (deadline 0)
    decision = decided now (unservable: the usual errors, nothing held), admitted (budgets)
    where    = the candidate ranked first; forecast = its carbon zone's, from the store
    needs    = needs_s(queue wait + prefill + decode_s)               (scheduler.deferral.duration,
                                                                       as the simulator)
    release  = choose_release(forecast, now, deadline, needs)          (scheduler.deferral.window)
               or now, reason ``chain``, for a chain's or DAG's step (``Request.holdable``)

then the request is written to the queue and only then answered. A request is named by its
tenant and its id: a retry of an id the caller's tenant submitted, held or answered, gets the
first submission's answer before anything is decided again; another tenant's id is another
request. Refused before anything is stored: a prompt over ``max_prompt_bytes``
(INVALID_ARGUMENT), a request whose jurisdictions may not be stored in this router's store
(``DeferralSettings.stores``: FAILED_PRECONDITION), a tenant at its ``max_held`` or
``max_bytes`` (RESOURCE_EXHAUSTED, naming the cap and its use). The store unreachable:
UNAVAILABLE, nothing held.

Release (``Deferrals.run``, the ``DeferralWorker``'s callable, round-robin over the tenants with
due requests, each release admitted by ``ReleaseGate``: the tenant's rate limit and stream cap,
as a live Generate): the held ``GenerateRequest`` is decided afresh on the snapshot of its
release with a TTFT SLO of min(its own or the class's, the time left to the deadline),
dispatched with failover, booked (ledger, audit) and collected into a ``DeferredStatus``. A
failure that retrying cannot mend (``final``: a bad request, a budget spent, nothing can serve
it) is answered at once as ``failed``; any other is retried every tick until the deadline,
then answered ``failed``.

Cancel (``Deferrals.cancel``): the request's record, payload, submission and answer are deleted
at once and a ``cancelled`` status is kept in the answer's place for a while
(``scheduler.deferral.queue.CANCELLED_TTL_S``): a late retry of its Defer is refused with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import uuid
from typing import Protocol

from google.rpc import code_pb2

from scheduler import errors
from scheduler.datalayer.carbon.store_io import read_forecast
from scheduler.datalayer.pending import prefill_s
from scheduler.deferral.duration import decode_s, needs_s
from scheduler.deferral.queue import (
    DONE,
    HELD,
    RUNNING,
    UNKNOWN,
    Cancelled,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    OverCap,
)
from scheduler.deferral.window import ForecastPoint, choose_release
from scheduler.framework.slo import class_ttft_budget_s
from scheduler.server import convert
from scheduler.server.auth import Principal
from scheduler.server.convert import MAX_PROMPT_BYTES
from scheduler.server.core import DEADLINE_CLOCK_SLACK_S, TRANSIENT_PLUGINS, RouterCore
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.server.metrics import Sample
from scheduler.server.router_parts import Proxying, SharedState, TenantLimits
from scheduler.server.status import rpc_status_for
from scheduler.server.tracing import NO_TRACE, RequestTrace
from scheduler.state.store import StateUnavailable
from scheduler.types import Candidate, FleetSnapshot, Request
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

log = logging.getLogger(__name__)

# The release reason of a chain's (or DAG's) step: released at once, never held.
CHAIN = "chain"
CHAIN_DETAIL = "released at once: a chain step never waits for batching"
FAILED = "failed"
CANCELLED = "cancelled"
# The furthest deadline accepted: forecasts reach a few days ahead, and the queue keeps a held
# request until its deadline (plus the grace), so a deadline beyond this would only hold a prompt.
MAX_DEFERRAL_S = 7 * 86400.0
# WaitDeferred reads the answer from the store this often.
POLL_S = 0.5


def predicted_completion_s(snapshot: FleetSnapshot, request: Request, candidate: Candidate) -> float:
    """The predicted time from dispatch to the last token on ``candidate``: queue wait +
    prefill + decode (without the network's round trip)."""
    return (snapshot.perf[candidate.index].queue_wait_s + prefill_s(snapshot, candidate, request)
            + decode_s(snapshot, request, candidate))


# Release failures that every retry would meet again (besides Unschedulable for reasons of the
# request rather than of the fleet's state now): answered ``failed`` at once.
FINAL_ERRORS = (errors.InvalidRequest, errors.PermissionDenied, errors.BudgetExhausted)


def final(exc: errors.SchedulerError) -> bool:
    """Whether a release failing with ``exc`` would fail the same way on every retry."""
    if isinstance(exc, errors.Unschedulable):
        return exc.plugin not in TRANSIENT_PLUGINS
    return isinstance(exc, FINAL_ERRORS)


def failure_text(exc: BaseException) -> str:
    """``CODE: message``, as the request's status would have said it (``DeferredStatus.error``)."""
    status = rpc_status_for(exc)
    return f"{code_pb2.Code.Name(status.code)}: {status.message}"


def replayed(status: router_pb2.DeferredStatus) -> errors.Replayed:
    """The failure a ``failed`` status records, to answer it again with its code."""
    code, _, message = status.error.partition(": ")
    return errors.Replayed(code, message or status.error)


def over_cap(tenant: str, refused: OverCap) -> errors.QuotaExceeded:
    """The refusal of a submission past one of the tenant's deferral caps, naming it and its use."""
    if refused.cap == "max_held":
        return errors.QuotaExceeded(tenant, "deferral max_held", refused.held, refused.limit, "requests", (
            f"tenant {tenant!r} holds {refused.held:,} deferred requests, its limit (deferral max_held "
            f"{refused.limit:,}): wait for some to run, or cancel some"))
    return errors.QuotaExceeded(tenant, "deferral max_bytes", refused.held_bytes, refused.limit, "bytes", (
        f"tenant {tenant!r} keeps {refused.held_bytes:,} bytes of deferred requests and answers; this one needs "
        f"{refused.needs_bytes:,} more, past its limit of {refused.limit:,} (deferral max_bytes): cancel answered "
        f"requests to free their answers, wait for them to expire, or send a smaller request"))


def not_held(exc: StateUnavailable) -> errors.Unavailable:
    """A submission the store could not take: nothing was held, a retry with the same id is safe."""
    return errors.Unavailable(f"the state store is unreachable; nothing was held (retry with the same request_id): "
                              f"{exc}", retry_after_s=1.0)


def _prefixed(exc: errors.InvalidRequest, prefix: str) -> errors.InvalidRequest:
    """The request's violations named by their path in the ``DeferRequest``."""
    return errors.InvalidRequest([errors.FieldViolation(prefix + v.field, v.description) for v in exc.violations])


class ReleaseGate:
    """A release runs under its tenant's limits, as a live Generate does: it takes one of the
    tenant's concurrent-stream slots on this router (given back when it ends) and one token of
    its rate (shared by the routers). A tenant over either waits for the next pass; the
    others' releases go on. The limits are those of the tenant's keys now (the lowest, when its
    keys set several), else the router's."""

    def __init__(self, deps: TenantLimits) -> None:
        self.deps = deps

    def principal(self, tenant: str) -> Principal:
        ring = self.deps.keys
        entries = [] if ring is None else [e for e in ring.entries.values() if e.tenant == tenant]
        return Principal(tenant=tenant, admin=False,
                         rate_limit_rps=min((e.rate_limit_rps for e in entries if e.rate_limit_rps), default=None),
                         max_concurrent_streams=min((e.max_concurrent_streams for e in entries
                                                     if e.max_concurrent_streams), default=None))

    async def enter(self, tenant: str) -> bool:
        principal = self.principal(tenant)
        try:
            self.deps.slots.acquire(principal)
        except errors.StreamLimited:
            return False
        try:
            await self.deps.limiter.check(principal)
        except errors.RateLimited:
            self.deps.slots.release(principal)
            return False
        return True

    def leave(self, tenant: str) -> None:
        self.deps.slots.release(Principal(tenant=tenant, admin=False))


class DeferralParts(Proxying, TenantLimits, SharedState, Protocol):
    """What the deferral queue takes of the router: a release is decided, admitted and proxied
    as a live request, under its tenant's limits; the queue lives in the shared store."""

    # This router's host, in the release worker's owner name.
    host_id: str


class Deferrals:
    """The router's deferral: submit, fetch, cancel, and the release loop (a background task)."""

    def __init__(self, deps: DeferralParts, settings: DeferralSettings | None = None) -> None:
        self.deps = deps
        self.settings = settings = settings if settings is not None else DeferralSettings()
        if settings.max_prompt_bytes > MAX_PROMPT_BYTES:
            raise ValueError(f"deferral max_prompt_bytes: at most a live request's {MAX_PROMPT_BYTES:,}, "
                             f"got {settings.max_prompt_bytes:,}")
        self.core = RouterCore(deps)
        self.queue = DeferralQueue(deps.store, claim_ttl_s=settings.claim_ttl_s, result_ttl_s=settings.result_ttl_s,
                                   grace_s=settings.grace_s, max_deferral_s=MAX_DEFERRAL_S, max_held=settings.max_held,
                                   max_bytes=settings.max_bytes, clock=deps.clock)
        self.gate = ReleaseGate(deps)
        # One owner per router process (a restarted one is another: its old claims lapse).
        owner = f"{deps.host_id}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.worker = DeferralWorker(self.queue, self.run, owner, self.give_up, interval_s=settings.interval_s,
                                     max_running=settings.max_running, gate=self.gate)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # zones whose stored forecast is too old to follow (logged once as it goes stale)
        self._stale_forecasts: set[str] = set()

    # --- the release loop, started and stopped with the router ----------------------------

    async def start(self) -> None:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.worker.run_forever(self._stop), name="deferral release loop")

    async def stop(self) -> None:
        """Stop releasing; the runs in progress are cancelled and give their claims back."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            await task

    def samples(self) -> list[Sample]:
        return [("scheduler_deferred_running", {}, float(self.worker.running))]

    # --- submit -----------------------------------------------------------------------------

    async def defer(self, principal: Principal, msg: router_pb2.DeferRequest,
                    trace: RequestTrace = NO_TRACE) -> router_pb2.DeferResponse:
        deps = self.deps
        now = deps.clock()
        self._check(msg, now)
        retried = await self._retried(principal, msg.request)
        if retried is not None:
            return retried
        try:
            snapshot, incoming, decision = self.core.decide(principal, msg.request, trace, dispatching=False)
        except errors.InvalidRequest as exc:
            raise _prefixed(exc, "request.") from None
        request = incoming.request
        refused = self.settings.refusal(request.allowed_jurisdictions)
        if refused is not None:
            raise refused
        for admit in deps.admission:
            admit(request)
        deadline = msg.deadline_unix_s or now + class_ttft_budget_s(snapshot.policy, "deferrable",
                                                                     request.prompt_tokens)
        candidate = decision.ranked_candidates[0]
        held = HeldRequest(
            request_id=request.request_id, tenant=request.tenant, enqueued_at=now, deadline=deadline, release_at=now,
            reason=CHAIN, detail=CHAIN_DETAIL, region=candidate.region.name,
            payload=self._payload(msg.request, request).SerializeToString())
        try:
            if request.holdable:
                needs = needs_s(predicted_completion_s(snapshot, request, candidate))
                release = choose_release(await self._forecast(candidate, now), now, deadline, needs)
                held = dataclasses.replace(held, release_at=release.at, reason=release.reason,
                                           detail=release.describe(), forecast_value=release.value,
                                           now_value=release.now_value)
            answer = router_pb2.DeferResponse(
                decision=convert.deferred_decision(
                    convert.decision_to_proto(decision, uuid.uuid4().hex, incoming, snapshot.config_version),
                    held.release_at, f"{held.reason}: {held.detail}"),
                request_id=request.request_id, release_at_unix_s=held.release_at, deadline_unix_s=deadline,
                reason=held.reason)
            ack = answer.SerializeToString()
            outcome = await self.queue.submit(held, ack)
        except StateUnavailable as exc:
            raise not_held(exc) from None
        if isinstance(outcome, OverCap):
            deps.metrics.inc("scheduler_deferred_refused_total", {"cap": outcome.cap})
            raise over_cap(request.tenant, outcome)
        if isinstance(outcome, Cancelled):  # a late retry of a cancelled submission: it stays so
            raise replayed(router_pb2.DeferredStatus.FromString(outcome.cancellation))
        if outcome.ack == ack:
            deps.metrics.inc("scheduler_deferred_total", {"reason": held.reason})
            log.info("deferred request %s (%s): release at %.0f, %s", request.request_id, request.tenant,
                     held.release_at, held.detail)
        return router_pb2.DeferResponse.FromString(outcome.ack)

    async def _retried(self, principal: Principal, msg: pb.GenerateRequest) -> router_pb2.DeferResponse | None:
        """The first answer when ``msg`` retries a submission of its tenant's that is held or
        answered (whatever the fleet or the budgets say now); None: decide it (a new id, or one
        whose hold lapsed, which the submission then holds again)."""
        tenant = msg.tenant or principal.tenant
        if tenant != principal.tenant and not principal.admin:
            return None  # deciding refuses it
        try:
            ack = await self.queue.submission(tenant, msg.request_id)
            if ack is None or await self.queue.status(tenant, msg.request_id) == UNKNOWN:
                return None
        except StateUnavailable as exc:
            raise not_held(exc) from None
        return router_pb2.DeferResponse.FromString(ack)

    def _check(self, msg: router_pb2.DeferRequest, now: float) -> None:
        """What ``Defer`` asks beyond a valid ``GenerateRequest``; every bad field at once."""
        bad = []
        request = msg.request
        if request.workload_class != pb.WORKLOAD_CLASS_DEFERRABLE:
            named = pb.WorkloadClass.DESCRIPTOR.values_by_number.get(request.workload_class)
            got = request.workload_class if named is None else named.name
            bad.append(errors.FieldViolation(
                "request.workload_class", f"must be WORKLOAD_CLASS_DEFERRABLE: only deferrable requests are held "
                                          f"(got {got})"))
        if not request.request_id:
            bad.append(errors.FieldViolation("request.request_id",
                                             "required: the idempotency key of a deferred request"))
        deadline = msg.deadline_unix_s
        if not math.isfinite(deadline) or deadline < 0:
            bad.append(errors.FieldViolation("deadline_unix_s", f"expected epoch seconds (0: the policy's "
                                                                f"deferrable SLO from now), got {deadline}"))
        elif 0 < deadline <= now:
            bad.append(errors.FieldViolation("deadline_unix_s", f"{deadline:.0f} is in the past (now {now:.0f})"))
        elif deadline > now + MAX_DEFERRAL_S:
            bad.append(errors.FieldViolation("deadline_unix_s", f"{deadline:.0f} is more than "
                                                                f"{MAX_DEFERRAL_S / 86400:g} days ahead"))
        kind = request.WhichOneof("input")
        size = (len(request.prompt.encode()) if kind == "prompt" else
                sum(len(m.role.encode()) + len(m.content.encode()) for m in request.chat.messages) if kind == "chat"
                else 0)
        limit = self.settings.max_prompt_bytes
        if size > limit:
            bad.append(errors.FieldViolation(f"request.{kind}", (
                f"at most {limit:,} bytes in a deferred request (it is stored until it runs; a live request may "
                f"have {MAX_PROMPT_BYTES:,}), got {size:,}")))
        if bad:
            raise errors.InvalidRequest(bad)

    async def _forecast(self, candidate: Candidate, now: float) -> list[ForecastPoint]:
        """The hourly carbon forecast of ``candidate``'s grid, from the store (the carbon pollers
        write it under the region's carbon source zone); [] when there is none, or when it was
        fetched longer ago than the policy's ``max_age.forecast`` (a forecast that old is not
        followed: the release is then ``no-forecast``, at once)."""
        builder = self.deps.refresher.builder
        regions = {r.name: r for r in builder.regions}
        config = regions.get(candidate.region.name)
        if config is None:
            return []
        signals = await read_forecast(self.deps.store, config.carbon.zone)
        if not signals:
            return []
        zone = config.carbon.zone
        fetched = max(s.fetched_at for s in signals)
        max_age = builder.policy.max_age.forecast
        if now - fetched > max_age:
            if zone not in self._stale_forecasts:
                self._stale_forecasts.add(zone)
                log.warning("carbon forecast of zone %s was fetched %.0f s ago (limit %.0f s): not followed, "
                            "deferred requests are released at once until a fresh one arrives",
                            zone, now - fetched, max_age)
            return []
        self._stale_forecasts.discard(zone)
        return sorted((s.observed_at, s.value) for s in signals)

    @staticmethod
    def _payload(msg: pb.GenerateRequest, request: Request) -> pb.GenerateRequest:
        """The request as it will be released: its tenant and id filled in, and the
        jurisdictions the submitter's key allowed (the release runs without the key)."""
        held = pb.GenerateRequest()
        held.CopyFrom(msg)
        held.tenant = request.tenant
        held.request_id = request.request_id
        del held.compliance.allowed_jurisdictions[:]
        held.compliance.allowed_jurisdictions.extend(sorted(request.allowed_jurisdictions))
        return held

    # --- the release ---------------------------------------------------------------------------

    async def run(self, item: HeldRequest) -> bytes:
        """Run a released request through the core path of ``Generate``; its ``DeferredStatus``."""
        deps = self.deps
        released_at = deps.clock()
        left_s = item.deadline - released_at
        if left_s <= 0:
            raise errors.DeadlineExceeded(f"released {-left_s:.0f} s after its deadline")
        msg = pb.GenerateRequest.FromString(item.payload)
        slo = deps.refresher.current().policy.slo_for("deferrable")
        left_ms = left_s * 1000.0
        if msg.slo.HasField("ttft_ms"):
            msg.slo.ttft_ms = min(msg.slo.ttft_ms, left_ms)
        elif left_ms < slo.ttft_ms:
            msg.slo.ttft_ms = left_ms
        deferral = f"{item.reason}: {item.detail}"
        try:
            stream = self.core.proxy(self.gate.principal(item.tenant), msg, left_s,
                                     released=(released_at, deferral))
        except errors.SchedulerError as exc:
            if not final(exc):
                raise
            return self._failed(item, exc)
        texts = []
        async with stream:
            async for delta in stream:
                texts.append(delta.text)
        if stream.failure is not None:
            raise stream.failure
        status = self._status(item, DONE)
        status.decision.CopyFrom(convert.deferred_decision(
            convert.decision_to_proto(stream.decision, stream.decision_id, stream.incoming,
                                      stream.snapshot.config_version), item.release_at, deferral))
        status.text = "".join(texts)
        if stream.receipt is not None:
            status.receipt.CopyFrom(convert.receipt_to_proto(stream.receipt))
        deps.metrics.inc("scheduler_deferred_released_total", {"state": DONE})
        return status.SerializeToString()

    def give_up(self, item: HeldRequest, exc: BaseException) -> bytes:
        """The answer of a request that could not run by its deadline."""
        return self._failed(item, exc)

    def _failed(self, item: HeldRequest, exc: BaseException) -> bytes:
        log.warning("deferred request %s failed: %s", item.request_id, exc)
        self.deps.metrics.inc("scheduler_deferred_released_total", {"state": FAILED})
        status = self._status(item, FAILED)
        status.error = failure_text(exc)
        return status.SerializeToString()

    @staticmethod
    def _status(item: HeldRequest, state: str) -> router_pb2.DeferredStatus:
        return router_pb2.DeferredStatus(request_id=item.request_id, state=state, release_at_unix_s=item.release_at,
                                         deadline_unix_s=item.deadline, reason=item.reason, detail=item.detail)

    # --- fetch ---------------------------------------------------------------------------------

    @staticmethod
    def _owner(principal: Principal, request_id: str, tenant: str) -> str:
        """The tenant whose request ``request_id`` names: the caller's, or (an admin) the one named."""
        if not request_id:
            raise errors.InvalidRequest([errors.FieldViolation("request_id", "required")])
        owner = tenant or principal.tenant
        if owner != principal.tenant and not principal.admin:
            raise errors.PermissionDenied(f"a key of tenant {principal.tenant!r} cannot act for {convert.show(owner)}")
        return owner

    async def status(self, principal: Principal, request_id: str, tenant: str = "") -> router_pb2.DeferredStatus:
        """Where a deferred request of the caller's tenant stands (an admin may name another
        tenant); ``NotFound`` when unknown or expired: another tenant's id names another request."""
        owner = self._owner(principal, request_id, tenant)
        queue = self.queue
        try:
            submission = await queue.submission(owner, request_id)
            answer = await queue.answer(owner, request_id)
            held = None if answer is not None else await queue.get(owner, request_id)
            state = UNKNOWN if held is None else await queue.status(owner, request_id)
        except StateUnavailable as exc:
            raise errors.Unavailable(f"the state store is unreachable: {exc}", retry_after_s=1.0) from None
        if submission is None and answer is None and held is None:
            raise errors.NotFound(f"no deferred request {convert.show(request_id)} for tenant {owner!r}")
        if answer is not None:
            return router_pb2.DeferredStatus.FromString(answer)
        if held is None:
            # Submitted, and its hold lapsed: the client was never answered for it, or a retry
            # with the same request_id holds it again.
            return router_pb2.DeferredStatus(request_id=request_id, state=UNKNOWN,
                                             detail="submitted but not held: submit it again with the same request_id")
        return self._status(held, RUNNING if state == RUNNING else HELD)

    async def cancel(self, principal: Principal, request_id: str, tenant: str = "") -> router_pb2.DeferredStatus:
        """Drop a deferred request of the caller's tenant (an admin may name another): held, it
        never runs; running, its answer is not kept; answered, the answer is deleted. What is
        kept (``CANCELLED_TTL_S``) is its ``cancelled`` status: a late retry of its Defer is
        refused with it (FAILED_PRECONDITION) and runs nothing. ``NotFound`` when unknown."""
        owner = self._owner(principal, request_id, tenant)
        current = await self.status(principal, request_id, tenant)
        if current.state == CANCELLED:
            return current
        cancelled = router_pb2.DeferredStatus(
            request_id=request_id, state=CANCELLED, release_at_unix_s=current.release_at_unix_s,
            deadline_unix_s=current.deadline_unix_s, reason=current.reason,
            detail=f"cancelled while {current.state}",
            error=f"FAILED_PRECONDITION: deferred request {convert.show(request_id)} was cancelled")
        try:
            was = await self.queue.cancel(owner, request_id, cancelled.SerializeToString())
        except StateUnavailable as exc:
            raise errors.Unavailable(f"the state store is unreachable; nothing was cancelled: {exc}",
                                     retry_after_s=1.0) from None
        if was is None:
            raise errors.NotFound(f"no deferred request {convert.show(request_id)} for tenant {owner!r}")
        self.deps.metrics.inc("scheduler_deferred_cancelled_total", {"was": current.state})
        log.info("deferred request %s (%s) cancelled while %s", request_id, owner, current.state)
        return cancelled

    async def wait(self, principal: Principal, request_id: str, remaining_s: float | None,
                   tenant: str = "") -> router_pb2.DeferredStatus:
        """The status once done, failed or cancelled, polling the store every ``POLL_S``;
        ``DeadlineExceeded`` when the call's deadline (without one: the router's longest stream)
        comes first."""
        deps = self.deps
        limit = remaining_s if remaining_s is not None else deps.dispatcher.settings.max_stream_s
        until = None if limit is None else deps.monotonic() + limit - DEADLINE_CLOCK_SLACK_S
        while True:
            status = await self.status(principal, request_id, tenant)
            if status.state in (DONE, FAILED, CANCELLED):
                return status
            left = None if until is None else until - deps.monotonic()
            if left is not None and left <= 0:
                raise errors.DeadlineExceeded(f"deferred request {convert.show(request_id)} is still {status.state} "
                                              f"(release at {status.release_at_unix_s:.0f})")
            await asyncio.sleep(POLL_S if left is None else min(POLL_S, left))
