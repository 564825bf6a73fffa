"""Table-driven tests, one table per filter: which candidates a filter keeps, and why not."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.framework.predict import request_view
from scheduler.framework.state import prepared, selected
from scheduler.plugins.filters.certifications import CertificationFilter
from scheduler.plugins.filters.context_fits import ContextFitsFilter
from scheduler.plugins.filters.model_available import ModelAvailableFilter
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.filters.pool_served import PoolServedFilter
from scheduler.plugins.filters.region_health import RegionHealthFilter
from scheduler.plugins.filters.residency import ResidencyFilter
from scheduler.plugins.filters.slo_reachable import SloReachableFilter
from scheduler.plugins.matchers.long_context import LongContextMatcher
from scheduler.types import GeoPoint, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, pool, region


def req(**overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": "t", "model": "llama-3.1-8b", "prompt_tokens": 500, "max_tokens": 100}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


@dataclass
class Case:
    name: str
    request: Request
    regions: list
    kept: set[str]
    reasons: dict[str, str] = field(default_factory=dict)  # key -> substring of the reason
    live: list = field(default_factory=list)


def run(plugin, case: Case, make_snapshot) -> tuple[set[str], dict[str, str]]:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(case.regions, live=case.live)
    base, _ = selected(ModelIndex(), case.request, snapshot)
    view = request_view(case.request, snapshot, base)
    cols = prepared(plugin, snapshot, base)
    keep = plugin.keep(view, cols)
    mask = np.ones(len(base), dtype=bool) if keep is None else keep
    keys = [snapshot.candidates[i].key for i in base]
    kept = {k for k, m in zip(keys, mask, strict=True) if m}
    reasons = {}
    for position, k in enumerate(keys):
        if not mask[position]:
            fmt, args = plugin.reason(view, cols, position)
            reasons[k] = fmt.format(*args)
    return kept, reasons


RESIDENCY = [
    Case("EU request, EU and US regions", req(allowed_jurisdictions=frozenset({"EU"})),
         [region("eu-north", "EU"), region("us-west", "US")], kept={"eu-north/h100"},
         reasons={"us-west/h100": "jurisdiction US not in ['EU']"}),
    Case("no jurisdiction asked: all pass", req(), [region("eu-north", "EU"), region("us-west", "US")],
         kept={"eu-north/h100", "us-west/h100"}),
    Case("EU asked, no EU region", req(allowed_jurisdictions=frozenset({"EU"})), [region("us-west", "US")], kept=set()),
    Case("EU or UK asked", req(allowed_jurisdictions=frozenset({"EU", "UK"})),
         [region("eu-north", "EU"), region("uk-south", "UK"), region("jp", "JP")],
         kept={"eu-north/h100", "uk-south/h100"}),
    Case("unknown jurisdiction asked", req(allowed_jurisdictions=frozenset({"CH"})), [region("eu-north", "EU")], kept=set()),
]


@pytest.mark.parametrize("case", RESIDENCY, ids=lambda c: c.name)
def test_residency(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(ResidencyFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


CERTIFICATIONS = [
    Case("HIPAA required", req(required_certifications=frozenset({"HIPAA"})),
         [region("a", certifications=("SOC2", "HIPAA")), region("b", certifications=("SOC2",))],
         kept={"a/h100"}, reasons={"b/h100": "lacks certification HIPAA"}),
    Case("two required, one region has both", req(required_certifications=frozenset({"HIPAA", "SOC2"})),
         [region("a", certifications=("SOC2", "HIPAA")), region("b", certifications=("HIPAA",))],
         kept={"a/h100"}, reasons={"b/h100": "SOC2"}),
    Case("none required", req(), [region("a", certifications=())], kept={"a/h100"}),
    Case("certification nobody holds", req(required_certifications=frozenset({"FedRAMP-High"})), [region("a")], kept=set()),
]


@pytest.mark.parametrize("case", CERTIFICATIONS, ids=lambda c: c.name)
def test_certifications(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(CertificationFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


A100_40_SHORT = pool("a100", "A100-40GB", models=[{"name": "llama-3.1-8b", "max_context": 32768}])
H200 = pool("h200", "H200-141GB")
FP8 = pool("fp8", "H100-80GB", models=[{"name": "llama-3.1-8b", "precision": "fp8", "max_context": 131072}])
CONTEXT = [
    Case("short prompt fits everywhere", req(prompt_tokens=1000), [region("r", pools=[A100_40_SHORT, H200])],
         kept={"r/a100", "r/h200"}),
    Case("over max_context", req(prompt_tokens=40000), [region("r", pools=[A100_40_SHORT, H200])],
         kept={"r/h200"}, reasons={"r/a100": "exceed max_context 32,768"}),
    Case("70B on one A100-80GB: weights leave no room for KV",
         req(model="llama-3.1-70b", prompt_tokens=1000),
         [region("r", pools=[pool("a80", "A100-80GB", models=[{"name": "llama-3.1-70b", "max_context": 131072}])])],
         kept=set(), reasons={"r/a80": "GB free"}),
    Case("70B on two H200 fits 100k",
         req(model="llama-3.1-70b", prompt_tokens=100000),
         [region("r", pools=[pool("h2", "H200-141GB", models=[{"name": "llama-3.1-70b", "max_context": 131072,
                                                                 "tensor_parallel": 2}])])],
         kept={"r/h2"}),
]


@pytest.mark.parametrize("case", CONTEXT, ids=lambda c: c.name)
def test_context_fits(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(ContextFitsFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


def live(name: str, *, healthy: bool = True, age_s: float = 0.0) -> RegionLiveState:
    return RegionLiveState(region=name, healthy=healthy, observed_at=NOW - age_s, pools={"h100": PoolLiveState()})


HEALTH = [
    Case("fresh and healthy", req(), [region("a")], kept={"a/h100"}, live=[live("a")]),
    Case("reports unhealthy", req(), [region("a"), region("b")], kept={"b/h100"},
         reasons={"a/h100": "unhealthy"}, live=[live("a", healthy=False), live("b")]),
    Case("stale (stopped publishing) counts as down", req(), [region("a"), region("b")], kept={"b/h100"},
         reasons={"a/h100": "old > limit"}, live=[live("a", age_s=60), live("b")]),
    Case("never seen is trusted (policy: missing=assume-healthy)", req(), [region("a")], kept={"a/h100"}),
]


@pytest.mark.parametrize("case", HEALTH, ids=lambda c: c.name)
def test_region_health(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(RegionHealthFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


TOKYO = GeoPoint(35.68, 139.69)
SLO = [
    Case("tight TTFT: only the near region", req(client_location=TOKYO, ttft_slo_ms=60),
         [region("jp", lat=35.7, lon=139.7), region("us", lat=39.0, lon=-77.5)], kept={"jp/h100"},
         reasons={"us/h100": "predicted TTFT"}),
    Case("loose TTFT: both", req(client_location=TOKYO, ttft_slo_ms=5000),
         [region("jp", lat=35.7, lon=139.7), region("us", lat=39.0, lon=-77.5)], kept={"jp/h100", "us/h100"}),
    Case("100k prompt on A100-40GB misses the interactive budget",
         req(prompt_tokens=100000),
         [region("r", pools=[pool("a100", "A100-80GB"), pool("h100", "H100-80GB")])],
         kept={"r/h100"}, reasons={"r/a100": "SLO"}),
    Case("TPOT budget", req(tpot_slo_ms=1.0), [region("r")], kept=set(), reasons={"r/h100": "TPOT"}),
]


@pytest.mark.parametrize("case", SLO, ids=lambda c: c.name)
def test_slo_reachable(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(SloReachableFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


MODEL = [
    Case("precision asked", req(precision="fp8"), [region("r", pools=[FP8, H200])], kept={"r/fp8"},
         reasons={"r/h200": "not the requested fp8"}),
    Case("sensitive task class never at reduced precision", req(task_class="medical"),
         [region("r", pools=[FP8, H200])], kept={"r/h200"}, reasons={"r/fp8": "reduced precision fp8"}),
    Case("ordinary task may use fp8", req(task_class="chat"), [region("r", pools=[FP8, H200])], kept={"r/fp8", "r/h200"}),
]


@pytest.mark.parametrize("case", MODEL, ids=lambda c: c.name)
def test_model_precision(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(ModelAvailableFilter(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


def test_model_source_rejects_pools_without_the_model_once_each(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    other = pool("qwen", "H100-80GB", models=[{"name": "qwen3-32b", "max_context": 32768},
                                              {"name": "llama-3.1-70b", "max_context": 32768, "tensor_parallel": 2}])
    snapshot = make_snapshot([region("r", pools=[other, H200])])
    base, rejected = selected(ModelIndex(), req(), snapshot)
    assert [snapshot.candidates[i].key for i in base] == ["r/h200"]
    assert [(r.candidate.key, r.plugin) for r in rejected] == [("r/qwen", "model-filter")]
    assert rejected[0].reason == "serves no llama-3.1-8b (serves qwen3-32b, llama-3.1-70b)"


def serving(name: str, *, age_s: float = 0.0, **pools: dict[str, int] | None) -> RegionLiveState:
    """A region's live state listing ``pools`` (pool -> {model: live context limit}, or None:
    the pool reports no model list)."""
    return RegionLiveState(region=name, healthy=True, observed_at=NOW - age_s,
                           pools={p: PoolLiveState(models=models) for p, models in pools.items()})


TWO_POOLS = [region("r", pools=[pool("h100", "H100-80GB"), H200])]
SERVED = [
    Case("config ∩ live: a pool the region does not report is not served", req(), TWO_POOLS, kept={"r/h200"},
         reasons={"r/h100": "not served: the region serves pools h200"},
         live=[serving("r", h200={"llama-3.1-8b": 2048})]),
    Case("a model the pool's deployment does not run is not served", req(), TWO_POOLS, kept={"r/h100"},
         reasons={"r/h200": "not served: pool h200 serves qwen3-32b"},
         live=[serving("r", h100=None, h200={"qwen3-32b": 32768})]),
    Case("prompt + output beyond the live context limit: only the long pool fits", req(prompt_tokens=1000),
         TWO_POOLS, kept={"r/h200"}, reasons={"r/h100": "1,100 tokens exceed the served context limit 512"},
         live=[serving("r", h100={"llama-3.1-8b": 512}, h200={"llama-3.1-8b": 2048})]),
    Case("a stale state says nothing about serving (the health filter judges it)", req(), TWO_POOLS,
         kept={"r/h100", "r/h200"}, live=[serving("r", age_s=600, h200={"llama-3.1-8b": 2048})]),
    Case("never seen: as configured", req(), TWO_POOLS, kept={"r/h100", "r/h200"}),
]


@pytest.mark.parametrize("case", SERVED, ids=lambda c: c.name)
def test_pool_served(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(PoolServedFilter(), case, make_snapshot)
    assert kept == case.kept
    assert set(reasons) == set(case.reasons)
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]


LONG = [
    Case("long prompt to large HBM", req(prompt_tokens=40000), [region("r", pools=[pool("h100", "H100-80GB"), H200])],
         kept={"r/h200"}, reasons={"r/h100": ">= 141 GB HBM"}),
    Case("short prompt: no preference", req(prompt_tokens=4000),
         [region("r", pools=[pool("h100", "H100-80GB"), H200])], kept={"r/h100", "r/h200"}),
]


@pytest.mark.parametrize("case", LONG, ids=lambda c: c.name)
def test_long_context_matcher(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    kept, reasons = run(LongContextMatcher(), case, make_snapshot)
    assert kept == case.kept
    for key, fragment in case.reasons.items():
        assert fragment in reasons[key]
