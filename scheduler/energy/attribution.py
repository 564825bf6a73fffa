"""Dividing a GPU's metered energy among the requests it served, by a versioned rule.

Two forms. Every receipt and ledger entry stores the version of the rule that made it, so
that old bills can be recomputed.

**Online, rule "predicted-share-v1"** (``split_interval``; the region's gateway applies it
while requests run, ``scheduler.region.inflight``). For every meter interval of every GPU,
with measured joules J and the requests on the replicas that run on that GPU, request i
weighed by the step model's energy of the tokens it processed in the interval
(``scheduler.energy.step``, at its replica's running batch B):

    p_i = prefill_i + decode_i
    prefill_i = E_prefill(prompt_i)                   in the interval of its first token
    decode_i  = E_decode(prompt_i, n1) - E_decode(prompt_i, n0)   completion tokens n0 -> n1
    share_i   = J x p_i / sum_k p_k                   (its prefill and decode parts likewise)

When no request on the GPU reported work in the interval (a prefill still running, tokens
not yet streamed), J is split by time on the replica in the interval instead (equally when
that is 0 too). An interval with no request on the GPU is idle: J goes to ``idle_j`` and to
no request. So sum_i share_i + idle_j = J in every interval (float rounding apart).

The half-width the split adds to a share: if p_i is off by a factor (1 + e) against the
others, share_i moves by share_i x e x (1 - f_i) to first order (f_i = share_i / J), so

    model_error_i = share_i x ratio_error_i x (1 - f_i)     (share_i x (1 - f_i) for a split by time)

with ratio_error the bound on one prediction's error against another's
(``scheduler.energy.validate.ratio_error``: the spread of the held-out residuals). A request
alone on its GPU gets the measurement exactly; the meter's own resolution is added by the
caller (``scheduler.energy.nvml``).

**Offline** (``attribute``, rules "equal-v1", "shared-v1", "marginal-v1": a replica's whole
trace after the fact). Input: the replica's energy trace (cumulative joules over time, e.g.
NVML's counter summed over its GPUs) and each request's timeline (arrived, started, first
token, finished, token counts). For every interval between two readings with metered energy dE:

  floor   = min(dE, floor_w x dt)   the execution-idle floor: fixed base share, split among the
                                    requests in flight by their time in the interval
  above   = dE - floor              split  activity_share  by tokens processed in the interval
                                           marginal_share  by the model's cost of that work
                                                           (uncached prefill tokens x e_prefill,
                                                            decode tokens x (e_step + e_kv x context))
                                           the rest        like the floor (time in flight)
An interval with no request in flight is idle: its energy is spread over all the trace's
requests in proportion to their time in flight (``idle_allocation_j``); with no request at all
it stays ``unattributed_j``. A share with nothing to weigh by (no tokens, no model) falls back
to the next (marginal -> activity -> time). So the joules given out always add up to the
metered total: nothing created, nothing lost.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from scheduler.energy.step import EnergyCoefficients


@dataclass(frozen=True, slots=True)
class AttributionRule:
    version: str
    # Fractions of the energy above the idle floor; the remainder is split by time in flight.
    activity_share: float
    marginal_share: float

    def __post_init__(self) -> None:
        if self.activity_share < 0 or self.marginal_share < 0 or self.activity_share + self.marginal_share > 1:
            raise ValueError(f"rule {self.version}: shares must be >= 0 and add up to at most 1")


RULES: Mapping[str, AttributionRule] = MappingProxyType(
    {
        rule.version: rule
        for rule in (
            # Everything by time in flight: simple, blind to how much work each request did.
            AttributionRule("equal-v1", activity_share=0.0, marginal_share=0.0),
            # Floor by time; the rest by tokens processed.
            AttributionRule("shared-v1", activity_share=1.0, marginal_share=0.0),
            # Floor by time; half by tokens, half by the model's marginal cost (long contexts pay more).
            AttributionRule("marginal-v1", activity_share=0.5, marginal_share=0.5),
        )
    }
)
DEFAULT_RULE = RULES["shared-v1"]
ONLINE_RULE = "predicted-share-v1"


@dataclass(frozen=True, slots=True)
class Work:
    """What one request did on one GPU during one meter interval (module doc)."""

    # The step model's energy of the prompt it prefilled and of the tokens it decoded (J).
    prefill_j: float
    decode_j: float
    # Its time on the replica in the interval (s): the weight when no request reported work.
    seconds: float
    # Whether its first token came (a time share is then decode, else prefill).
    decoding: bool
    # Bound on the relative error of its prediction against the others' on the GPU.
    ratio_error: float

    @property
    def predicted_j(self) -> float:
        return self.prefill_j + self.decode_j


@dataclass(frozen=True, slots=True)
class Share:
    prefill_j: float
    decode_j: float
    # Of the interval's measured joules.
    fraction: float
    # The half-width the split adds (module doc).
    model_error_j: float

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j


@dataclass(frozen=True, slots=True)
class IntervalSplit:
    measured_j: float
    shares: Mapping[str, Share]
    idle_j: float
    # "predicted", "time" or "idle": what the shares were weighed by.
    weighed_by: str

    @property
    def attributed_j(self) -> float:
        return sum(s.energy_j for s in self.shares.values())


def split_interval(measured_j: float, work: Mapping[str, Work]) -> IntervalSplit:
    """One GPU's joules of one interval among the requests on it by rule "predicted-share-v1"
    (module doc)."""
    if not work:
        return IntervalSplit(measured_j, MappingProxyType({}), measured_j, "idle")
    predicted = sum(w.predicted_j for w in work.values())
    shares: dict[str, Share] = {}
    if predicted > 0.0:
        for request_id, w in work.items():
            fraction = w.predicted_j / predicted
            energy = measured_j * fraction
            shares[request_id] = Share(prefill_j=measured_j * w.prefill_j / predicted,
                                       decode_j=measured_j * w.decode_j / predicted, fraction=fraction,
                                       model_error_j=energy * w.ratio_error * (1.0 - fraction))
        return IntervalSplit(measured_j, MappingProxyType(shares), 0.0, "predicted")
    seconds = sum(w.seconds for w in work.values())
    for request_id, w in work.items():
        fraction = w.seconds / seconds if seconds > 0.0 else 1.0 / len(work)
        energy = measured_j * fraction
        shares[request_id] = Share(prefill_j=0.0 if w.decoding else energy, decode_j=energy if w.decoding else 0.0,
                                   fraction=fraction, model_error_j=energy * (1.0 - fraction))
    return IntervalSplit(measured_j, MappingProxyType(shares), 0.0, "time")


@dataclass(frozen=True, slots=True)
class EnergyTrace:
    """Cumulative energy (J) of one replica at increasing times (s)."""

    times: tuple[float, ...]
    joules: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times) != len(self.joules) or len(self.times) < 2:
            raise ValueError("an energy trace needs at least two (time, joules) readings")
        if any(b <= a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ValueError("energy trace times must increase")

    @classmethod
    def from_counter(cls, readings: Sequence[tuple[float, float]]) -> EnergyTrace:
        """(time, cumulative J) readings; a counter that goes backwards (driver reload)
        contributes nothing for that interval rather than a negative bill."""
        times = tuple(t for t, _ in readings)
        total, joules, last = 0.0, [0.0], readings[0][1] if readings else 0.0
        for _, value in readings[1:]:
            total += max(0.0, value - last)
            joules.append(total)
            last = value
        return cls(times, tuple(joules))

    @classmethod
    def from_power(cls, samples: Sequence[tuple[float, float]]) -> EnergyTrace:
        """(time, watts) samples integrated with the trapezoid rule."""
        joules, total = [0.0], 0.0
        for (t0, w0), (t1, w1) in itertools.pairwise(samples):
            total += (w0 + w1) / 2 * (t1 - t0)
            joules.append(total)
        return cls(tuple(t for t, _ in samples), tuple(joules))

    @property
    def total_j(self) -> float:
        return self.joules[-1] - self.joules[0]


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """One request on the replica: queued at ``arrived_at``, prefill from ``started_at``,
    decode from ``first_token_at`` to ``finished_at``."""

    request_id: str
    arrived_at: float
    started_at: float
    first_token_at: float
    finished_at: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not self.arrived_at <= self.started_at <= self.first_token_at <= self.finished_at:
            raise ValueError(f"request {self.request_id}: timeline out of order")


@dataclass(frozen=True, slots=True)
class RequestEnergy:
    request_id: str
    energy_j: float
    waiting_j: float
    prefill_j: float
    decode_j: float
    idle_allocation_j: float
    # Prefill energy the prefix cache saved (model estimate; 0 without coefficients).
    avoided_j: float
    # Mean number of requests running alongside (itself included) while it ran.
    batch_size: float
    attribution_method: str


@dataclass(frozen=True, slots=True)
class Attribution:
    rule: str
    metered_j: float
    requests: Mapping[str, RequestEnergy]
    unattributed_j: float

    @property
    def attributed_j(self) -> float:
        return sum(r.energy_j for r in self.requests.values())


def attribute(
    trace: EnergyTrace,
    requests: Sequence[RequestTimeline],
    rule: AttributionRule = DEFAULT_RULE,
    floor_w: float = 0.0,
    coefficients: EnergyCoefficients | None = None,
) -> Attribution:
    """Divide ``trace`` among ``requests`` by ``rule``; see the module docstring."""
    n = len(requests)
    waiting, prefill, decode = [0.0] * n, [0.0] * n, [0.0] * n
    time_in_flight = [0.0] * n
    run_weighted_batch, run_time = [0.0] * n, [0.0] * n
    idle_j = 0.0
    for a, b, e0, e1 in zip(trace.times, trace.times[1:], trace.joules, trace.joules[1:], strict=False):
        spent = e1 - e0
        phases = [_phase_overlaps(r, a, b) for r in requests]
        in_flight = [w + p + d for w, p, d in phases]
        if sum(in_flight) <= 0.0:
            idle_j += spent
            continue
        running = [p + d for _, p, d in phases]
        batch_now = sum(running) / (b - a)
        for i, r_time in enumerate(running):
            time_in_flight[i] += in_flight[i]
            run_weighted_batch[i] += r_time * batch_now
            run_time[i] += r_time
        floor = min(spent, floor_w * (b - a))
        above = spent - floor
        by_time = floor + above * (1.0 - rule.activity_share - rule.marginal_share)
        _share_by_time(by_time, phases, waiting, prefill, decode)
        work = [_work(r, a, b) for r in requests]
        costs = [_cost(r, w, a, b, coefficients) for r, w in zip(requests, work, strict=True)]
        activity_j, marginal_j = above * rule.activity_share, above * rule.marginal_share
        if sum(c[0] + c[1] for c in costs) <= 0.0:
            activity_j += marginal_j
            marginal_j = 0.0
        if sum(w[0] + w[1] for w in work) <= 0.0:
            _share_by_time(activity_j, phases, waiting, prefill, decode)
            activity_j = 0.0
        _share_by_work(activity_j, work, prefill, decode)
        _share_by_work(marginal_j, costs, prefill, decode)

    total_time = sum(time_in_flight)
    idle_shares = [idle_j * t / total_time if total_time > 0 else 0.0 for t in time_in_flight]
    result = {
        r.request_id: RequestEnergy(
            request_id=r.request_id,
            energy_j=waiting[i] + prefill[i] + decode[i] + idle_shares[i],
            waiting_j=waiting[i],
            prefill_j=prefill[i],
            decode_j=decode[i],
            idle_allocation_j=idle_shares[i],
            avoided_j=coefficients.avoided_j(r.prompt_tokens, r.cached_tokens) if coefficients is not None else 0.0,
            batch_size=run_weighted_batch[i] / run_time[i] if run_time[i] > 0 else 0.0,
            attribution_method=rule.version,
        )
        for i, r in enumerate(requests)
    }
    return Attribution(
        rule=rule.version,
        metered_j=trace.total_j,
        requests=MappingProxyType(result),
        unattributed_j=idle_j if total_time <= 0 else 0.0,
    )


def _overlap(a: float, b: float, start: float, end: float) -> float:
    return max(0.0, min(b, end) - max(a, start))


def _phase_overlaps(r: RequestTimeline, a: float, b: float) -> tuple[float, float, float]:
    return (
        _overlap(a, b, r.arrived_at, r.started_at),
        _overlap(a, b, r.started_at, r.first_token_at),
        _overlap(a, b, r.first_token_at, r.finished_at),
    )


def _fraction(a: float, b: float, start: float, end: float) -> float:
    """Share of the phase [start, end] inside [a, b); an instantaneous phase counts whole
    in the interval that holds it."""
    if end > start:
        return _overlap(a, b, start, end) / (end - start)
    return 1.0 if a <= start < b else 0.0


def _work(r: RequestTimeline, a: float, b: float) -> tuple[float, float]:
    """(uncached prefill tokens, decode tokens) the request processed in [a, b)."""
    uncached = max(0, r.prompt_tokens - r.cached_tokens)
    return (
        uncached * _fraction(a, b, r.started_at, r.first_token_at),
        r.output_tokens * _fraction(a, b, r.first_token_at, r.finished_at),
    )


def _cost(
    r: RequestTimeline, work: tuple[float, float], a: float, b: float, coefficients: EnergyCoefficients | None
) -> tuple[float, float]:
    """The model's energy for that work: prefill tokens, and decode steps at the context the
    request had reached in the middle of the interval."""
    if coefficients is None:
        return 0.0, 0.0
    prefill_tokens, decode_tokens = work
    done = _fraction(r.first_token_at, (a + b) / 2, r.first_token_at, r.finished_at)
    context = r.prompt_tokens + r.output_tokens * done
    return (
        prefill_tokens * coefficients.prefill_j_per_token,
        decode_tokens * (coefficients.step_j + coefficients.step_j_per_context_token * context),
    )


def _share_by_time(
    joules: float, phases: Sequence[tuple[float, float, float]], waiting: list[float], prefill: list[float],
    decode: list[float],
) -> None:
    total = sum(w + p + d for w, p, d in phases)
    if joules == 0.0 or total <= 0.0:
        return
    for i, (w, p, d) in enumerate(phases):
        waiting[i] += joules * w / total
        prefill[i] += joules * p / total
        decode[i] += joules * d / total


def _share_by_work(
    joules: float, weights: Sequence[tuple[float, float]], prefill: list[float], decode: list[float]
) -> None:
    total = sum(p + d for p, d in weights)
    if joules == 0.0 or total <= 0.0:
        return
    for i, (p, d) in enumerate(weights):
        prefill[i] += joules * p / total
        decode[i] += joules * d / total
