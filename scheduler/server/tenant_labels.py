"""The cardinality guard of the router's ``tenant`` metric labels (``--metrics-max-tenants``).

Its own module, without prometheus_client, so that building the command line parser does not
load the metrics library."""

from __future__ import annotations

from dataclasses import dataclass, field

# A tenant label per tenant up to this many per process; the rest are "other".
DEFAULT_MAX_TENANT_LABELS = 50
OTHER_TENANTS = "other"


@dataclass
class TenantLabels:
    """The first ``max_tenants`` tenants seen keep their name, every later one is ``other`` (so a
    flood of tenants cannot grow the series)."""

    max_tenants: int = DEFAULT_MAX_TENANT_LABELS
    _named: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if self.max_tenants < 0:
            raise ValueError(f"max_tenants: expected an integer >= 0, got {self.max_tenants}")

    def label(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if len(self._named) < self.max_tenants and tenant != OTHER_TENANTS:
            self._named.add(tenant)
            return tenant
        return OTHER_TENANTS
