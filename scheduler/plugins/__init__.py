"""Filters, matchers, scorers and the picker; ``register_all`` is the one registration list."""

from __future__ import annotations

from scheduler.framework.registry import Registry
from scheduler.plugins.filters import (
    certifications,
    context_fits,
    model_available,
    region_health,
    residency,
    slo_reachable,
)
from scheduler.plugins.matchers import long_context
from scheduler.plugins.pickers import max_score
from scheduler.plugins.scorers import carbon, energy, latency, load, price


def register_all(registry: Registry) -> Registry:
    # The model index narrows the fleet first; its precision rules then run as a filter.
    registry.source(model_available.TYPE, model_available.ModelAvailableFilter)
    registry.filter(model_available.TYPE, model_available.ModelAvailableFilter)
    registry.filter(residency.TYPE, residency.ResidencyFilter)
    registry.filter(certifications.TYPE, certifications.CertificationFilter)
    registry.filter(context_fits.TYPE, context_fits.ContextFitsFilter)
    registry.filter(region_health.TYPE, region_health.RegionHealthFilter)
    registry.filter(slo_reachable.TYPE, slo_reachable.SloReachableFilter)
    registry.matcher(long_context.TYPE, long_context.LongContextMatcher)
    registry.scorer(energy.TYPE, energy.EnergyScorer)
    registry.scorer(carbon.TYPE, carbon.CarbonScorer)
    registry.scorer(latency.TYPE, latency.LatencyScorer)
    registry.scorer(load.TYPE, load.LoadScorer)
    registry.scorer(price.TYPE, price.PriceScorer)
    registry.picker(max_score.TYPE, max_score.MaxScorePicker)
    return registry


def default_scheduler_registry() -> Registry:
    return register_all(Registry())
