"""A Decision as the JSON object and the table that ``route --explain`` (and the router's
``Route`` answer) show: every term of the objective with its quantity, unit, rate and cost.
Derived from the Decision alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from scheduler.types import Candidate, Decision

TOTAL_UNIT = "USD"


def objective_text(decision: Decision) -> str:
    """'cost [USD] = 1000 USD/tCO2e x carbon-scorer [gCO2e] + ...' for the applied objective."""
    return objective_of(decision.scorer_names, decision.units, decision.rates_written)


def objective_of(names: Sequence[str], units: Sequence[str], written: Sequence[str]) -> str:
    """``objective_text`` of the scorers that answered: their names, units and rates as written."""
    if not names:
        return "cost [USD] = 0 (every scorer abstained: ties broken per request)"
    terms = (f"{rate} x {name} [{unit}]" for name, unit, rate in zip(names, units, written, strict=True))
    return f"cost [{TOTAL_UNIT}] = " + " + ".join(terms)


def bounds_by_candidate(decision: Decision) -> dict[str, list[dict[str, Any]]]:
    """``region/pool`` -> the bounds its quantities were priced at (a signal it depends on was
    unusable): the scorer, the signal, whose it was, the bound and its unit."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in decision.fallbacks:
        if f.bound is None:
            continue
        for key in f.candidates:
            out.setdefault(key, []).append({"scorer": f.scorer, "signal": f.signal, "key": f.key, "bound": f.bound,
                                            "unit": f.bound_unit, "age_s": f.age_s})
    return out


def warmth_of(decision: Decision, candidate: Candidate) -> dict[str, Any]:
    """The candidate's pool as the decision saw it: warm, starting or cold, and what its cold
    start adds to the request (seconds to its TTFT, joules of the wake-up to its energy)."""
    perf = decision.perf[candidate.index] if decision.perf else None
    if perf is None:
        return {"warmth": "warm", "cold_start_s": 0.0, "wake_j": 0.0}
    return {"warmth": perf.warmth, "cold_start_s": perf.cold_start_s, "wake_j": perf.wake_j}


def warmth_text(decision: Decision, candidate: Candidate) -> str:
    """'warm', 'starting +38 s' or 'cold +38 s +2,852 J' (the explain table's pool column)."""
    found = warmth_of(decision, candidate)
    if found["warmth"] == "warm":
        return "warm"
    text = f"{found['warmth']} +{found['cold_start_s']:.0f} s"
    return text + (f" +{found['wake_j']:,.0f} J" if found["wake_j"] else "")


def explain_dict(decision: Decision) -> dict[str, Any]:
    chosen = decision.chosen
    bounds = bounds_by_candidate(decision)
    return {
        "request_id": decision.request_id,
        "policy": decision.policy,
        "schedulable": decision.schedulable,
        "energy_ranking": decision.energy_ranking,
        "objective": objective_text(decision),
        "units": dict(zip(decision.scorer_names, decision.units, strict=True)),
        "rates": {
            name: {"usd_per_unit": rate, "as_written": written}
            for name, rate, written in zip(decision.scorer_names, decision.rates, decision.rates_written, strict=True)
        },
        "total_unit": TOTAL_UNIT,
        "chosen": None
        if chosen is None
        else {
            "region": chosen.candidate.region.name,
            "pool": chosen.candidate.pool.name,
            "gpu": chosen.candidate.gpu.name,
            "model": chosen.candidate.deployment.name,
            "precision": chosen.candidate.deployment.precision,
            **warmth_of(decision, chosen.candidate),
            "energy": None if decision.energy is None else asdict(decision.energy),
            "kind": chosen.candidate.region.kind,
            "tickets_enforced": chosen.candidate.region.tickets_enforced,
            "energy_measured": chosen.candidate.region.energy_measured,
        },
        "candidates": [
            {
                "region": s.candidate.region.name,
                "pool": s.candidate.pool.name,
                "gpu": s.candidate.gpu.name,
                **warmth_of(decision, s.candidate),
                "scores": dict(s.quantities),
                "costs": dict(s.costs),
                "total": s.total,
                "bounds": bounds.get(s.candidate.key, []),
                "tickets_enforced": s.candidate.region.tickets_enforced,
            }
            for s in decision.ranked
        ],
        "rejected": [
            {"region": r.candidate.region.name, "pool": r.candidate.pool.name, "plugin": r.plugin, "reason": r.reason}
            for r in decision.rejected
        ],
        "fallbacks": [
            {"signal": f.signal, "scorer": f.scorer, "age_s": f.age_s, "max_age_s": f.max_age_s, "detail": f.detail,
             "key": f.key, "bound": f.bound, "bound_unit": f.bound_unit, "candidates": list(f.candidates)}
            for f in decision.fallbacks
        ],
    }


def _number(value: float) -> str:
    """Four significant figures, without exponents for everyday magnitudes."""
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:,.4g}" if abs(value) >= 1e3 else f"{value:.4g}"
    return f"{value:.3e}"


def explain_table(decision: Decision) -> str:
    lines: list[str] = []
    chosen = decision.chosen
    if chosen is None:
        lines.append("chosen   none: no region satisfies the request's hard constraints")
    else:
        c = chosen.candidate
        estimate = decision.energy
        energy = f"   ~{estimate.energy_j:,.1f} J ({estimate.provenance})" if estimate else ""
        if estimate is not None and estimate.cold_start_j:
            energy += f", of which {estimate.cold_start_j:,.0f} J wakes the pool"
        lines.append(f"chosen   {c.region.name} / {c.pool.name} ({c.gpu.name}, {c.deployment.precision}), "
                     f"{warmth_text(decision, c)}{energy}")
        mode = "energy/carbon objective" if decision.energy_ranking else "fallback (performance) objective"
        lines.append(f"policy   {decision.policy}: {mode}, lowest cost first")
        lines.append(f"         {objective_text(decision)}")
        headers = [f"{name.removesuffix('-scorer')} {unit}" for name, unit in zip(decision.scorer_names, decision.units,
                                                                                   strict=True)]
        widths = [max(11, len(h)) for h in headers]
        header = f"{'rank':<5} {'region':<14} {'pool':<12} {'gpu':<11} {'warmth':<22}" + "".join(
            f" {h:>{w}}" for h, w in zip(headers, widths, strict=True))
        lines.append(header + f" {'cost ' + TOTAL_UNIT:>11}")
        bounded = {(key, b["scorer"]) for key, found in bounds_by_candidate(decision).items() for b in found}
        for rank, s in enumerate(decision.ranked, start=1):
            c = s.candidate
            # (a quantity priced at a bound, its signal unusable, is marked *: see fallbacks)
            cells = "".join(
                f" {_number(s.quantities[name]) + ('*' if (c.key, name) in bounded else ''):>{w}}"
                for name, w in zip(decision.scorer_names, widths, strict=True))
            lines.append(f"{rank:<5} {c.region.name:<14} {c.pool.name:<12} {c.gpu.name:<11} "
                         f"{warmth_text(decision, c):<22}{cells} {_number(s.total):>11}")
        plain = sorted({s.candidate.region.name for s in decision.ranked if not s.candidate.region.tickets_enforced})
        if plain:
            lines.append(f"plain vLLM  {', '.join(plain)} (kind vllm): tickets_enforced false (a dispatch ticket is not "
                         "checked there), energy modelled, not measured")
    if decision.rejected:
        lines.append("rejected")
        for r in decision.rejected:
            c = r.candidate
            lines.append(f"      {c.region.name:<14} {c.pool.name:<12} {r.plugin:<22} {r.reason}")
    if decision.fallbacks:
        lines.append("fallbacks")
        for f in decision.fallbacks:
            if f.age_s is None and f.max_age_s == 0:
                lines.append(f"      {f.signal:<14} {f.detail}")
                continue
            if f.age_s is None:
                state = f"never seen (limit {f.max_age_s:,.0f} s)"
            elif f.age_s > f.max_age_s:
                state = f"age {f.age_s:,.0f} s > limit {f.max_age_s:,.0f} s"
            else:
                state = f"unusable at age {f.age_s:,.0f} s"
            lines.append(f"      {f.signal:<14} {state} ({f.scorer}: {f.detail})")
            if f.bound is not None:
                lines.append(f"      {'':<14} * priced at {f.bound:g} {f.bound_unit}: {', '.join(f.candidates)}")
    else:
        lines.append("fallbacks  none")
    return "\n".join(lines)
