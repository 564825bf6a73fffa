"""The router's work, whatever the transport: decide, sign direct-mode targets, proxy a stream
and book its receipt.

The gRPC servicers (scheduler.server.servicers) and the HTTP front door
(scheduler.server.http_api) are thin adapters over ``RouterCore``: the same decision, the same
admission (budgets), the same tickets, the same dispatch with failover, the same receipts in
the same ledger and audit stream. Failures are ``scheduler.errors`` outcomes; each edge maps
them once to its own status.

Every proxied stream that relayed text books exactly one receipt: complete, or partial when
the client goes away, a deadline passes or the region fails after the first token
(``docs/billing.md``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import islice
from types import TracebackType
from typing import NamedTuple

from scheduler import errors
from scheduler.canary.assign import snapshot_for
from scheduler.canary.runtime import OpenStream
from scheduler.energy.output_budget import OutputBudget, best_budget
from scheduler.policy import Policy
from scheduler.server import convert
from scheduler.server.auth import Principal, scope_jurisdictions
from scheduler.server.canary import stream_outcome, ttft_budget_ms
from scheduler.server.dispatch import RegionStream, TextDelta
from scheduler.server.receipt_builder import ReceiptInputs, build_receipt
from scheduler.server.router_parts import Proxying
from scheduler.server.tracing import NO_TRACE, RequestTrace, decision_attributes, receipt_attributes, request_attributes
from scheduler.types import Candidate, Decision, EnergyReceipt, FleetSnapshot, Request
from scheduler.v1 import messages_pb2, router_pb2

# Unschedulable because of these plugins is about the fleet's state now (retry later); any other
# (residency, certifications, context, model) is about the request.
TRANSIENT_PLUGINS = frozenset({"region-health", "pool-served", "slo-reachable"})

# gRPC cancels a call at its deadline on its own timer, and the deadline we hold was read from
# ``time_remaining()`` a moment before the stream started: a cancellation this close to the
# client's deadline is the deadline, not the client leaving.
DEADLINE_CLOCK_SLACK_S = 0.05

def output_budget(policy: Policy, request: Request, decision: Decision) -> OutputBudget | None:
    """The policy's quality-per-joule max_tokens for this request on the chosen candidate
    (scheduler.energy.output_budget); None when the policy has no table for its model and task."""
    config = policy.output_budget
    if config is None or decision.energy_inputs is None:
        return None
    table = config.table(request.model, request.task_class)
    if table is None:
        return None
    coefficients, prompt, cached, _ = decision.energy_inputs
    return best_budget(table.points(), request.max_tokens,
                       lambda n: coefficients.estimate(prompt, cached, n).energy_j, config.mode)


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


def new_id() -> str:
    """A random 128-bit id in hex (a decision's, or a request's that came without one): as
    unique as a UUID4's hex, at a quarter of its cost."""
    return os.urandom(16).hex()


class Target(NamedTuple):
    """A ranked candidate the client may stream from itself (direct mode), with its ticket (a
    tuple: a Route makes up to ``direct_targets`` of them, and a frozen dataclass's fields
    cost a ``__setattr__`` each)."""

    region: str
    pool: str
    model: str
    url: str
    ticket: str
    expires_at: float


@dataclass(frozen=True)
class Routed:
    decision_id: str
    snapshot: FleetSnapshot
    incoming: convert.Incoming
    decision: Decision
    # Empty when the router signs no tickets (regions without tickets: development only).
    targets: tuple[Target, ...]

    def to_proto(self) -> router_pb2.RouteResponse:
        """The Route answer (built in place: a message passed to a constructor is copied)."""
        answer = router_pb2.RouteResponse()
        convert.fill_decision(answer.decision, self.decision, self.decision_id, self.incoming,
                              self.snapshot.config_version)
        add_target = answer.targets.add
        for t in self.targets:
            add_target(region=t.region, pool=t.pool, model=t.model, url=t.url, ticket=t.ticket,
                       expires_at_unix_s=t.expires_at)
        return answer


@dataclass
class ProxyRun:
    """One proxied stream: ``async with`` it (the region request goes out on entry), iterate
    the text, then read ``receipt`` (None when no text went out) and ``failure`` (an early
    end after text: the receipt is partial and the edge reports the failure after it)."""

    deps: Proxying
    decision_id: str
    snapshot: FleetSnapshot
    incoming: convert.Incoming
    decision: Decision
    stream: RegionStream
    started: float
    client_deadline: float | None
    trace: RequestTrace = NO_TRACE
    # A request the deferral queue released: (when, "<reason>: <explanation>"); its receipt says so.
    released: tuple[float, str] | None = None
    # Send the region request on entry, in a task, so the caller can build the decision message
    # while the region prefills (gRPC, Connect); False: on the first iteration, in the caller's
    # task (the OpenAI API sends no decision message: the task would only cost).
    prefetch: bool = True
    receipt: EnergyReceipt | None = None
    failure: errors.SchedulerError | None = None
    _booked: bool = field(default=False, init=False)
    # The receipt booked for this stream, however it ended (``receipt`` only when the client got it).
    _booked_receipt: EnergyReceipt | None = field(default=None, init=False, repr=False)
    # The stream as the canary's counts know it while it runs (None: the policy has no canary).
    _canary: OpenStream | None = field(default=None, init=False, repr=False)
    _deltas: AsyncIterator[TextDelta] | None = field(default=None, init=False, repr=False)

    async def __aenter__(self) -> ProxyRun:
        deps = self.deps
        deps.active_streams += 1
        deps.metrics.active_streams.inc()
        # The router's own time on the call: decision, admission and tickets, before the region.
        deps.metrics.proxy_overhead.observe(deps.monotonic() - self.started)
        if self.prefetch:
            self.stream.start()
        if self.snapshot.canary is not None and deps.canary is not None:
            # No first token by the TTFT budget: a miss for its arm at once, not when it ends.
            budget_s = ttft_budget_ms(self.incoming.request, self.snapshot) / 1000.0
            stream = self.stream
            self._canary = deps.canary.begin(self.snapshot, self.started + budget_s,
                                             lambda: stream.first_text_at is not None)
        return self

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        self._deltas = self._relay()
        return self._deltas

    async def _relay(self) -> AsyncIterator[TextDelta]:
        end_reason = "complete"
        try:
            async for delta in self.stream:
                yield delta
        except errors.DeadlineExceeded as exc:
            self.failure, end_reason = exc, "deadline"
        except errors.Unavailable as exc:
            if self.stream.first_text_at is None:
                raise
            self.failure, end_reason = exc, "region-error"
        self.receipt = self._book(end_reason)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        deps = self.deps
        if not self._booked:
            if kind is not None and issubclass(kind, Exception):
                self._book("error")  # an unexpected failure after text went out is billed too
            else:
                # Cancelled (the client went away, its deadline passed, the router is stopping)
                # after text went out: the client cannot get a receipt any more, but the ledger
                # and the audit do. Booked before any await, so a stopping router's ledger
                # drains it.
                self._book("deadline" if self._deadline_passed() else "cancelled")
        deps.active_streams -= 1
        deps.metrics.active_streams.dec()
        deltas, self._deltas = self._deltas, None
        if deltas is not None:
            await deltas.aclose()  # type: ignore[attr-defined]
        await self.stream.aclose()
        if self.stream.failovers:
            deps.metrics.failovers(attempt.region for attempt in self.stream.failovers)
        if self.trace.recording:
            self.trace.span.set_attribute("scheduler.failovers", len(self.stream.failovers))
        if self.snapshot.canary is not None and deps.canary is not None:
            # Counted in its arm's window (no I/O here; scheduler.canary.runtime).
            failed = (kind is not None and issubclass(kind, Exception)) or self.failure is not None
            outcome = stream_outcome(self.incoming.request, self.snapshot, self._booked_receipt,
                                     bool(self.stream.failovers), failed, self._deadline_passed())
            deps.canary.observe(self.snapshot, outcome, self._canary)

    def _deadline_passed(self) -> bool:
        return (self.client_deadline is not None
                and self.deps.monotonic() >= self.client_deadline - DEADLINE_CLOCK_SLACK_S)

    def _book(self, end_reason: str) -> EnergyReceipt | None:
        """Build and book this stream's receipt once; None when no region answered (no text)."""
        stream = self.stream
        candidate = stream.candidate if end_reason == "complete" else (
            stream.current if stream.first_text_at is not None else None)
        if self._booked or candidate is None:
            return None
        deps = self.deps
        trace = self.trace
        span = trace.child("scheduler.receipt")
        receipt = build_receipt(ReceiptInputs(
            decision_id=self.decision_id,
            request_id=self.incoming.request.request_id,
            tenant=self.incoming.request.tenant,
            candidate=candidate,
            snapshot=self.snapshot,
            fallbacks=self.decision.fallbacks,
            failovers=tuple(stream.failovers),
            prompt_tokens=self.incoming.counted_prompt_tokens,
            usage=stream.usage,
            energy=stream.energy,
            ttft_ms=None if stream.first_text_at is None else (stream.first_text_at - self.started) * 1000,
            duration_ms=(deps.monotonic() - self.started) * 1000,
            relayed_events=stream.content_events,
            end_reason=end_reason,
            output_budget=self.incoming.output_budget,
            released_at=None if self.released is None else self.released[0],
            deferral="" if self.released is None else self.released[1],
        ))
        self._booked = True
        self._booked_receipt = receipt
        deps.book(receipt)
        if trace.recording:
            attributes = receipt_attributes(receipt, stream.finish_reason)
            span.set_attributes(attributes)
            trace.span.set_attributes(attributes)
        span.end()
        return receipt


class RouterCore:
    def __init__(self, deps: Proxying) -> None:
        self.deps = deps

    def decide(self, principal: Principal, msg: messages_pb2.GenerateRequest, trace: RequestTrace = NO_TRACE,
               dispatching: bool = True) -> tuple[FleetSnapshot, convert.Incoming, Decision]:
        """Validate, decide, count the dispatch; ``Unschedulable`` when nothing survives.
        ``dispatching`` False: nothing goes out now (a request the deferral queue holds), so no
        dispatch is counted against the chosen pool's queue."""
        with trace.child("scheduler.decide") as span:
            tenant = msg.tenant or principal.tenant
            if tenant != principal.tenant and not principal.admin:
                raise errors.PermissionDenied(
                    f"a key of tenant {principal.tenant!r} cannot act for {convert.show(tenant)}")
            deps = self.deps
            snapshot = deps.refresher.current()
            incoming = convert.incoming(msg, tenant, snapshot)
            # A key bound to jurisdictions narrows (or fills in) where the request may run.
            allowed = scope_jurisdictions(principal, sorted(incoming.request.allowed_jurisdictions))
            if frozenset(allowed) != incoming.request.allowed_jurisdictions:
                incoming = dataclasses.replace(incoming, request=dataclasses.replace(
                    incoming.request, allowed_jurisdictions=frozenset(allowed)))
            if trace.recording:
                trace.span.set_attributes(request_attributes(incoming.request, incoming.call.path, incoming.call.body))
            # The policy's canary arm decides when it is on and the request's key is in its share
            # (its snapshot carries the arm's policy); else the control does (scheduler.canary).
            snapshot = snapshot_for(incoming.request, snapshot)
            began = time.perf_counter()
            decision = deps.scheduler.schedule(incoming.request, snapshot)
            deps.metrics.decision(decision, time.perf_counter() - began)
            if trace.recording:
                span.set_attributes(decision_attributes(decision))
                if snapshot.config_version:
                    span.set_attribute("scheduler.config_version", snapshot.config_version)
            if not decision.schedulable:
                raise unschedulable(decision)
            budget = output_budget(snapshot.policy, incoming.request, decision)
            if budget is not None:
                if budget.enforced:
                    # Decided again at the budget's max_tokens: the ranking, the tickets and the
                    # energy prediction are those of the request that will run.
                    incoming = convert.with_max_tokens(incoming, budget.max_tokens)
                    decision = deps.scheduler.schedule(incoming.request, snapshot)
                    if not decision.schedulable:
                        raise unschedulable(decision)
                incoming = dataclasses.replace(incoming, output_budget=budget)
        # Route answers send the client there too (direct mode): both count as dispatched.
        if dispatching:
            deps.refresher.record_dispatch(snapshot, decision.ranked_candidates[0], incoming.request)
        return snapshot, incoming, decision

    def route(self, principal: Principal, msg: messages_pb2.GenerateRequest, trace: RequestTrace = NO_TRACE,
              ) -> Routed:
        """The decision and, when the router signs tickets, the top ranked candidates with one
        each: the client may dispatch itself, after the same admission as a proxied stream."""
        deps = self.deps
        started = deps.monotonic()
        routed = self._route(principal, msg, trace)
        deps.metrics.route_overhead.observe(deps.monotonic() - started)
        return routed

    def _route(self, principal: Principal, msg: messages_pb2.GenerateRequest, trace: RequestTrace) -> Routed:
        snapshot, incoming, decision = self.decide(principal, msg, trace)
        decision_id = new_id()
        deps = self.deps
        if trace.recording:
            trace.span.set_attribute("scheduler.decision_id", decision_id)
        issuer = deps.tickets
        if issuer is None:
            return Routed(decision_id, snapshot, incoming, decision, ())
        for admit in deps.admission:
            admit(incoming.request)
        sign = issuer.signer(decision_id=decision_id, request=incoming.request, body=incoming.call.body,
                             endpoint=incoming.call.path, snapshot=snapshot, mode="direct")
        expires_at = issuer.clock() + issuer.ttl_s
        # A plain vLLM region checks no ticket and writes no receipt: a client streaming from it
        # directly would go unbilled, so it is reached in proxy mode only (docs/byo-vllm.md).
        reachable = (candidate for candidate in decision.ranked_candidates if candidate.region.tickets_enforced)
        targets = tuple(
            Target(candidate.region.name, candidate.pool.name, candidate.deployment.name,
                   candidate.region.endpoint.rstrip("/") + incoming.call.path, sign(candidate), expires_at)
            for candidate in islice(reachable, deps.direct_targets)
        )
        return Routed(decision_id, snapshot, incoming, decision, targets)

    def proxy(self, principal: Principal, msg: messages_pb2.GenerateRequest, remaining_s: float | None,
              trace: RequestTrace = NO_TRACE, released: tuple[float, str] | None = None,
              prefetch: bool = True) -> ProxyRun:
        """A stream to run (``async with``): decided and admitted here, dispatched on entry
        (``prefetch``) or on the first iteration. ``remaining_s``: the client's deadline from now
        (None: none); ``trace``: the request's; ``released``: (when, why) the deferral queue
        released it (None: not deferred)."""
        deps = self.deps
        started = deps.monotonic()
        snapshot, incoming, decision = self.decide(principal, msg, trace)
        for admit in deps.admission:
            admit(incoming.request)
        decision_id = new_id()
        if trace.recording:
            trace.span.set_attribute("scheduler.decision_id", decision_id)
        tenant = incoming.request.tenant
        issuer = deps.tickets
        ticket_for: Callable[[Candidate], str] | None = None if issuer is None else issuer.signer(
            decision_id=decision_id, request=incoming.request, body=incoming.call.body,
            endpoint=incoming.call.path, snapshot=snapshot, mode="proxy")
        client_deadline = None if remaining_s is None else started + remaining_s
        # The stream's deadline: the client's, capped by the router's max_stream_s.
        # The prefix key and workflow go along: the region publishes the keys its cache served
        # (scheduler.region.prefix_warm), which is how the router learns where a prefix is warm.
        hints = {"decision_id": decision_id, "tenant": tenant}
        if incoming.request.prefix_key:
            hints["prefix_key"] = incoming.request.prefix_key
        if incoming.request.workflow_id:
            hints["workflow_id"] = incoming.request.workflow_id
        stream = deps.dispatcher.stream(decision, incoming.call, client_deadline, hints, ticket_for, trace)
        return ProxyRun(deps, decision_id, snapshot, incoming, decision, stream, started, client_deadline, trace,
                        released, prefetch)
