"""``TicketIssuer``: the router's side of dispatch tickets (``scheduler.tickets``).

For each candidate it dispatches to (proxy mode) or hands to the client (direct mode), the
router signs a ticket under the candidate region's active key. The ticket binds the body the
engine will run by its digest and the endpoint it goes to, so the region can check them
without trusting the client; it also carries the carbon intensity the decision saw (None
when stale), with which the region prices its receipt (in proxy mode too: the region's
receipt of a proxied stream may be the one the ledger keeps, ``docs/billing.md``).

Each attempt gets its own expiry: a ticket signed later than ``RESIGN_AFTER_S`` after the
dispatch's first gets a fresh ``expires_at`` (a proxied failover after a region hung for a
minute still carries a live ticket).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.tickets import MAX_TICKET_TTL_S, ClaimsSigner, Mode, TicketKeyRing, body_digest
from scheduler.types import Candidate, FleetSnapshot, Request, Signal

# Entries of the own-claims cache: candidates x carbon signals of a few snapshots.
OWN_PARTS_LIMIT = 4096
# A ticket signed this long after its dispatch's first gets its own expiry.
RESIGN_AFTER_S = 1.0


@dataclass(frozen=True)
class TicketIssuer:
    keys: TicketKeyRing
    ttl_s: float = MAX_TICKET_TTL_S
    clock: Callable[[], float] = field(default=time.time)
    # (candidate, carbon signal) -> its tickets' own claims, encoded (``ClaimsSigner.own_part``)
    _own_parts: dict[tuple[int, int], tuple[Candidate, Signal | None, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.ttl_s <= MAX_TICKET_TTL_S:
            raise ValueError(f"ticket ttl_s must be in (0, {MAX_TICKET_TTL_S:.0f}] s, got {self.ttl_s}")

    def signer(self, *, decision_id: str, request: Request, body: Mapping[str, Any], endpoint: str,
               snapshot: FleetSnapshot, mode: Mode) -> Callable[[Candidate], str]:
        """Signs this dispatch's ticket for a candidate (``body``: the region's OpenAI request,
        sent to ``endpoint``). The body is digested once here, however many candidates get a
        ticket."""
        bound = body_digest(body)
        if bound is None:
            raise ValueError("the request body has no prompt or messages a ticket can bind")
        ring = self.keys
        max_carbon_age = snapshot.policy.max_age.carbon
        clock, ttl_s = self.clock, self.ttl_s

        def shared(at: float) -> ClaimsSigner:
            # The claims every candidate's ticket shares, serialised once per expiry; each ticket
            # adds where it runs. Together they are ``Ticket``'s fields (tests/unit/test_tickets.py).
            return ClaimsSigner("ticket", {
                "decision_id": decision_id, "request_id": request.request_id, "tenant": request.tenant,
                "max_tokens": request.max_tokens, "prompt_tokens_max": request.prompt_tokens,
                "body_sha256": bound[0], "endpoint": endpoint, "expires_at": at + ttl_s, "mode": mode,
                "workload_class": request.workload_class})

        signed_at = clock()
        signer = shared(signed_at)
        carbon = snapshot.carbon
        parts = self._own_parts

        def sign(candidate: Candidate) -> str:
            nonlocal signed_at, signer
            region = candidate.region
            signal = carbon.get(region.grid_zone)
            if signal is not None and snapshot.age(signal.observed_at) > max_carbon_age:
                signal = None
            # Where it runs and the carbon it saw: the same for every dispatch there until the
            # signal is replaced (the entry keeps both, so their ids stay theirs).
            key = (id(candidate), id(signal))
            entry = parts.get(key)
            if entry is None or entry[0] is not candidate or entry[1] is not signal:
                if signal is not None:
                    own = {"region": region.name, "pool": candidate.pool.name, "model": candidate.deployment.name,
                           "carbon_g_per_kwh": signal.value, "carbon_zone": signal.key,
                           "carbon_observed_at": signal.observed_at, "carbon_source": signal.source}
                else:
                    own = {"region": region.name, "pool": candidate.pool.name, "model": candidate.deployment.name,
                           "carbon_g_per_kwh": None, "carbon_zone": "", "carbon_observed_at": None,
                           "carbon_source": ""}
                if len(parts) >= OWN_PARTS_LIMIT:
                    parts.clear()
                entry = parts[key] = (candidate, signal, signer.own_part(own))
            now = clock()
            if now - signed_at > RESIGN_AFTER_S:  # a later attempt: its own expiry
                signed_at, signer = now, shared(now)
            return signer.sign_part(ring.of(region.name), entry[2])

        return sign
