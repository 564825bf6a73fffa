"""A Decision as the JSON object and the table that ``route --explain`` (and the router's
``Route`` answer) show. Derived from the Decision alone."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from scheduler.types import Decision

SCORE_COLUMNS = ("energy", "carbon", "latency", "load", "price")
ENERGY_LAYER_WEIGHTS = ("energy", "carbon")


def explain_dict(decision: Decision) -> dict[str, Any]:
    chosen = decision.chosen
    return {
        "request_id": decision.request_id,
        "policy": decision.policy,
        "schedulable": decision.schedulable,
        "energy_ranking": decision.energy_ranking,
        "weights": dict(decision.weights),
        "chosen": None
        if chosen is None
        else {
            "region": chosen.candidate.region.name,
            "pool": chosen.candidate.pool.name,
            "gpu": chosen.candidate.gpu.name,
            "model": chosen.candidate.deployment.name,
            "precision": chosen.candidate.deployment.precision,
            "energy": None if decision.energy is None else asdict(decision.energy),
        },
        "candidates": [
            {
                "region": s.candidate.region.name,
                "pool": s.candidate.pool.name,
                "gpu": s.candidate.gpu.name,
                "scores": dict(s.raw),
                "weighted": dict(s.weighted),
                "total": s.total,
            }
            for s in decision.ranked
        ],
        "rejected": [
            {"region": r.candidate.region.name, "pool": r.candidate.pool.name, "plugin": r.plugin, "reason": r.reason}
            for r in decision.rejected
        ],
        "fallbacks": [
            {"signal": f.signal, "scorer": f.scorer, "age_s": f.age_s, "max_age_s": f.max_age_s, "detail": f.detail}
            for f in decision.fallbacks
        ],
    }


def explain_table(decision: Decision) -> str:
    lines: list[str] = []
    chosen = decision.chosen
    if chosen is None:
        lines.append("chosen   none: no region satisfies the request's hard constraints")
    else:
        c = chosen.candidate
        estimate = decision.energy
        energy = f"   ~{estimate.energy_j:,.1f} J ({estimate.provenance})" if estimate else ""
        lines.append(f"chosen   {c.region.name} / {c.pool.name} ({c.gpu.name}, {c.deployment.precision}){energy}")
        uses_energy = decision.energy_ranking and any(k in decision.weights for k in ENERGY_LAYER_WEIGHTS)
        mode = "energy/carbon ranking" if uses_energy else "performance order"
        if not decision.energy_ranking:
            mode += " (fallback)"
        weights = ", ".join(f"{k}={v:g}" for k, v in decision.weights.items())
        lines.append(f"policy   {decision.policy}: {mode}; weights {weights}")
        header = f"{'rank':<5} {'region':<14} {'pool':<12} {'gpu':<11}" + "".join(f" {k:>8}" for k in SCORE_COLUMNS)
        lines.append(header + f" {'total':>7}")
        for rank, s in enumerate(decision.ranked, start=1):
            cells = "".join(f" {s.raw[k]:>8.2f}" if k in s.raw else f" {'-':>8}" for k in SCORE_COLUMNS)
            c = s.candidate
            lines.append(f"{rank:<5} {c.region.name:<14} {c.pool.name:<12} {c.gpu.name:<11}{cells} {s.total:>7.3f}")
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
            age = "never seen" if f.age_s is None else f"age {f.age_s:,.0f} s"
            lines.append(f"      {f.signal:<14} {age} > limit {f.max_age_s:,.0f} s ({f.scorer}: {f.detail})")
    else:
        lines.append("fallbacks  none")
    return "\n".join(lines)
