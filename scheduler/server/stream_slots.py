"""Per-tenant caps on concurrent Generate streams: fair use of the router's dispatch pool and
of the regions behind it.

A router relays every Generate stream over one connection of its dispatch pool
(``DispatchSettings.max_connections``, 1,024), to a region gateway whose replica takes at most
``GATEWAY_MAX_ONGOING`` requests at once (its Serve ``max_ongoing_requests``); one tenant
opening hundreds of long streams would starve the others. Each tenant may hold at most
``max_streams`` streams at once on one router (the router's default, or its key's
``max_concurrent_streams``); the next one is refused with ``StreamLimited``
(RESOURCE_EXHAUSTED) before anything is dispatched. The default is a quarter of one gateway
replica: a tenant at its cap leaves a one-replica region three quarters of its capacity (a
cap of 256, a quarter of the dispatch pool, was a whole replica's), and a tenant that needs
more gets it by its key. The edge takes a slot before the stream starts and gives it back when the stream
ends, however it ends (done, error, client cancel). Counted in this process only: it guards
this router's pool, not a fleet-wide quota.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler import errors
from scheduler.server.auth import Principal
from scheduler.server.metrics import Sample

# Requests one region gateway replica takes at once (scheduler.region.gateway's Serve deployment;
# not imported from there, which would import Ray into the router).
GATEWAY_MAX_ONGOING = 256
# The streams one tenant may hold by default: a quarter of one gateway replica.
DEFAULT_MAX_STREAMS = GATEWAY_MAX_ONGOING // 4


@dataclass
class StreamSlots:
    max_streams: int = DEFAULT_MAX_STREAMS
    _held: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    refused: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(f"max_streams: expected at least 1, got {self.max_streams}")

    def acquire(self, principal: Principal) -> None:
        """Take a slot for the principal's tenant, or raise ``StreamLimited``; pair with ``release``."""
        limit = principal.max_concurrent_streams or self.max_streams
        held = self._held.get(principal.tenant, 0)
        if held >= limit:
            self.refused += 1
            raise errors.StreamLimited(principal.tenant, limit)
        self._held[principal.tenant] = held + 1

    def release(self, principal: Principal) -> None:
        held = self._held.get(principal.tenant, 0) - 1
        if held > 0:
            self._held[principal.tenant] = held
        else:
            self._held.pop(principal.tenant, None)

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def samples(self) -> Iterable[Sample]:
        """Gauges for /metrics: streams held per tenant (only tenants holding some) and refusals."""
        yield ("scheduler_router_stream_limit_rejections_total", {}, float(self.refused))
        for tenant, held in sorted(self._held.items()):
            yield ("scheduler_router_tenant_streams", {"tenant": tenant}, float(held))
