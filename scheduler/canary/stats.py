"""The figures of each canary arm per window, and the rollback rule over them.

Every proxied stream an arm decided counts once in the window it ended in (``Outcome``):

    requests      streams the arm decided and dispatched
    ttft_n/ok     of them, those with a verdict on the TTFT SLO, and those that met it. A
                  stream that ended with no text and not by the client's leaving is a miss;
                  one the client left before its first token has no verdict.
    errors        no region answered, a region failed after the first token, or a deadline
                  passed (the router's or the client's)
    retried       streams that failed over to another region at least once
    energy_n/j    streams with a receipt that has energy, and its joules
    carbon_n/g    likewise for gCO2e

and the shares and means are read from those sums (``ArmFigures``):

    TTFT-SLO attainment = ttft_ok / ttft_n      error rate = errors / requests
    retry rate = retried / requests             J/request = energy_j / energy_n (gCO2e alike)

The rule (``judge``) reads the current window and the one before it together, so it always
rests on one to two windows of traffic; it judges nothing until the canary arm has
``min_requests`` there, and a bound relative to the control only once the control has as many.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from scheduler.policy import CanaryRollback

FIELDS = ("requests", "ttft_n", "ttft_ok", "errors", "retried", "energy_n", "energy_j", "carbon_n", "carbon_g")


@dataclass(frozen=True)
class Outcome:
    """How one proxied stream went, for its arm's window."""

    # None: no verdict (the client left before the first token).
    ttft_ok: bool | None
    error: bool
    retried: bool
    energy_j: float | None = None
    carbon_g: float | None = None

    def amounts(self) -> dict[str, float]:
        out = {"requests": 1.0}
        if self.ttft_ok is not None:
            out["ttft_n"] = 1.0
            out["ttft_ok"] = 1.0 if self.ttft_ok else 0.0
        if self.error:
            out["errors"] = 1.0
        if self.retried:
            out["retried"] = 1.0
        if self.energy_j is not None:
            out["energy_n"] = 1.0
            out["energy_j"] = self.energy_j
        if self.carbon_g is not None:
            out["carbon_n"] = 1.0
            out["carbon_g"] = self.carbon_g
        return out


def hash_field(arm: str, name: str) -> str:
    """The window hash's field for ``arm``'s count ``name``."""
    return f"{arm}|{name}"


@dataclass(frozen=True)
class ArmFigures:
    requests: float = 0.0
    ttft_n: float = 0.0
    ttft_ok: float = 0.0
    errors: float = 0.0
    retried: float = 0.0
    energy_n: float = 0.0
    energy_j: float = 0.0
    carbon_n: float = 0.0
    carbon_g: float = 0.0

    @classmethod
    def from_hash(cls, table: Mapping[str, str], arm: str) -> ArmFigures:
        """One arm's counts from a window hash (a field that does not parse counts 0)."""
        values = {}
        for name in FIELDS:
            raw = table.get(hash_field(arm, name))
            try:
                values[name] = max(0.0, float(raw)) if raw is not None else 0.0
            except ValueError:
                values[name] = 0.0
        return cls(**values)

    def __add__(self, other: ArmFigures) -> ArmFigures:
        return ArmFigures(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @staticmethod
    def _ratio(part: float, whole: float) -> float | None:
        return part / whole if whole > 0 else None

    @property
    def ttft_slo_attainment(self) -> float | None:
        return self._ratio(self.ttft_ok, self.ttft_n)

    @property
    def error_rate(self) -> float | None:
        return self._ratio(self.errors, self.requests)

    @property
    def retry_rate(self) -> float | None:
        return self._ratio(self.retried, self.requests)

    @property
    def energy_j_per_request(self) -> float | None:
        return self._ratio(self.energy_j, self.energy_n)

    @property
    def gco2e_per_request(self) -> float | None:
        return self._ratio(self.carbon_g, self.carbon_n)

    def summary(self) -> dict[str, float | None]:
        return {"requests": self.requests, "ttft_slo_attainment": self.ttft_slo_attainment,
                "error_rate": self.error_rate, "retry_rate": self.retry_rate,
                "energy_j_per_request": self.energy_j_per_request, "gco2e_per_request": self.gco2e_per_request}


def _pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def _points(value: float) -> str:
    return f"{value * 100:.1f} points"


@dataclass(frozen=True)
class Verdict:
    """Why the canary arm rolls back: the metrics whose bounds it crossed, and in words."""

    metrics: tuple[str, ...]
    reason: str


def judge(rule: CanaryRollback, control: ArmFigures, canary: ArmFigures) -> Verdict | None:
    """Why the canary arm must roll back, or None. Judged once the arm has ``min_requests``;
    the bounds relative to the control once the control has as many."""
    if canary.requests < rule.min_requests:
        return None
    versus = control.requests >= rule.min_requests
    problems: list[str] = []
    crossed: list[str] = []

    attainment = rule.ttft_slo_attainment
    value, ref = canary.ttft_slo_attainment, control.ttft_slo_attainment
    if attainment is not None and value is not None:
        if attainment.min is not None and value < attainment.min:
            problems.append(f"TTFT-SLO attainment {_pct(value)} is below the floor of {_pct(attainment.min)}")
            crossed.append("ttft_slo_attainment")
        if attainment.max_drop is not None and versus and ref is not None and ref - value > attainment.max_drop:
            problems.append(f"TTFT-SLO attainment {_pct(value)} is {_points(ref - value)} below the control's "
                            f"{_pct(ref)} (at most {_points(attainment.max_drop)})")
            crossed.append("ttft_slo_attainment")

    for name, label in (("error_rate", "error rate"), ("retry_rate", "retry rate")):
        bounds = getattr(rule, name)
        value, ref = getattr(canary, name), getattr(control, name)
        if bounds is None or value is None:
            continue
        if bounds.max is not None and value > bounds.max:
            problems.append(f"{label} {_pct(value)} is above the ceiling of {_pct(bounds.max)}")
            crossed.append(name)
        if bounds.max_rise is not None and versus and ref is not None and value - ref > bounds.max_rise:
            problems.append(f"{label} {_pct(value)} is {_points(value - ref)} above the control's {_pct(ref)} "
                            f"(at most {_points(bounds.max_rise)})")
            crossed.append(name)

    for name, label, unit in (("energy_j_per_request", "energy per request", "J"),
                              ("gco2e_per_request", "carbon per request", "gCO2e")):
        bounds = getattr(rule, name)
        value, ref = getattr(canary, name), getattr(control, name)
        if bounds is None or value is None:
            continue
        if bounds.max is not None and value > bounds.max:
            problems.append(f"{label} {value:.4g} {unit} is above the ceiling of {bounds.max:.4g} {unit}")
            crossed.append(name)
        if bounds.max_ratio is not None and versus and ref is not None and ref > 0 and value / ref > bounds.max_ratio:
            problems.append(f"{label} {value:.4g} {unit} is {value / ref:.2f}x the control's {ref:.4g} {unit} "
                            f"(at most {bounds.max_ratio:g}x)")
            crossed.append(name)

    if not problems:
        return None
    return Verdict(tuple(dict.fromkeys(crossed)),
                   f"{'; '.join(problems)}; canary {canary.requests:.0f} requests, control {control.requests:.0f}, "
                   f"over the last {rule.window:g}-{2 * rule.window:g} s")


def describe(rule: CanaryRollback) -> list[str]:
    """The rule, one line per bound (``scheduler canary status``)."""
    lines = [f"judged over the current and the previous {rule.window:g} s window, once the canary has "
             f"{rule.min_requests} requests there (and the control as many, for the bounds relative to it)"]
    attainment = rule.ttft_slo_attainment
    if attainment is not None:
        if attainment.min is not None:
            lines.append(f"TTFT-SLO attainment below {_pct(attainment.min)}")
        if attainment.max_drop is not None:
            lines.append(f"TTFT-SLO attainment more than {_points(attainment.max_drop)} below the control's")
    for name, label in (("error_rate", "error rate"), ("retry_rate", "retry rate")):
        bounds = getattr(rule, name)
        if bounds is None:
            continue
        if bounds.max is not None:
            lines.append(f"{label} above {_pct(bounds.max)}")
        if bounds.max_rise is not None:
            lines.append(f"{label} more than {_points(bounds.max_rise)} above the control's")
    for name, label, unit in (("energy_j_per_request", "energy per request", "J"),
                              ("gco2e_per_request", "carbon per request", "gCO2e")):
        bounds = getattr(rule, name)
        if bounds is None:
            continue
        if bounds.max is not None:
            lines.append(f"{label} above {bounds.max:g} {unit}")
        if bounds.max_ratio is not None:
            lines.append(f"{label} above {bounds.max_ratio:g}x the control's")
    return lines
