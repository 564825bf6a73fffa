"""Filters, matchers, scorers and the picker; ``register_all`` is the one registration list
(the names a policy may use are the TYPEs registered here)."""

from __future__ import annotations

from scheduler.framework.registry import Registry
from scheduler.plugins.filters import (
    certifications,
    cold_pool,
    context_fits,
    model_available,
    model_index,
    pool_served,
    region_health,
    residency,
    slo_reachable,
    telemetry_gate,
)
from scheduler.plugins.matchers import long_context
from scheduler.plugins.pickers import lowest_cost
from scheduler.plugins.scorers import affinity, carbon, energy, price, queue, slo_risk, ttft


def register_all(registry: Registry) -> Registry:
    # The model index narrows the fleet first; its precision rules then run as a filter.
    registry.source(model_index.TYPE, model_index.ModelIndex)
    registry.filter(model_available.TYPE, model_available.ModelAvailableFilter)
    registry.filter(residency.TYPE, residency.ResidencyFilter)
    registry.filter(certifications.TYPE, certifications.CertificationFilter)
    registry.filter(context_fits.TYPE, context_fits.ContextFitsFilter)
    registry.filter(region_health.TYPE, region_health.RegionHealthFilter)
    registry.filter(pool_served.TYPE, pool_served.PoolServedFilter)
    # Before the SLO filter: a cold pool's rejection names its cold start.
    registry.filter(cold_pool.TYPE, cold_pool.ColdPoolFilter)
    registry.filter(slo_reachable.TYPE, slo_reachable.SloReachableFilter)
    registry.filter(telemetry_gate.TYPE, telemetry_gate.TelemetryGateFilter)
    registry.matcher(long_context.TYPE, long_context.LongContextMatcher)
    registry.scorer(energy.TYPE, energy.EnergyScorer)
    registry.scorer(carbon.TYPE, carbon.CarbonScorer)
    registry.scorer(price.TYPE, price.PriceScorer)
    registry.scorer(ttft.TYPE, ttft.TtftScorer)
    registry.scorer(queue.TYPE, queue.QueueScorer)
    registry.scorer(slo_risk.TYPE, slo_risk.SloRiskScorer)
    registry.scorer(affinity.TYPE, affinity.AffinityScorer)
    registry.picker(lowest_cost.TYPE, lowest_cost.LowestCostPicker)
    return registry


def default_scheduler_registry() -> Registry:
    return register_all(Registry())
