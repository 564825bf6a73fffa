"""The energy receipt that closes every ``Generate`` stream (ARCHITECTURE section 6).

Energy comes from the region's ``energy`` object (measured: ``nvml`` or ``node-share``) when
it sends one; otherwise from the energy model's estimate for the pool that answered, with
the token counts the region reported (``measurement_source: model``), always so on a plain
vLLM region (kind ``vllm``, ``tickets_enforced: false``; docs/byo-vllm.md). A field nothing
measured stays ``None`` (absent in the proto).

Partial receipts: a stream that relayed text and then ended early (the client cancelled, a
deadline passed, the region failed) is billed too (``partial``, ``end_reason``). The region
sends its usage only in the final event, so the router then counts the tokens itself
(``tokens_estimated``): the completion tokens are the content events it relayed (vLLM
streams about one token per event: a detokenizer that merges tokens makes it low), the
prompt tokens its own estimate from the prompt's bytes, no cached tokens. Never the counts
the client declared: a client could declare a short or fully cached prompt and have its
prefill billed at nothing. Energy is the model's estimate for those tokens. A region with
tickets writes its own receipt of the stream on the engine's counts, which replaces this one
in the ledger (``scheduler.ledger.ledger``).

Carbon is that energy x a carbon intensity x the region's PUE. The intensity is the
snapshot's signal for the region's zone when ``signal_check.signal_problem`` accepts it
(``carbon_basis: "signal"``). When the signal is stale, dated in the future, invalid or
missing, a request still emitted carbon, so it is booked at a conservative bound, never 0:
the larger of the last usable value seen (if the value itself is valid) and
``UPPER_BOUND_G_PER_KWH`` (1,100 gCO2e/kWh: no grid's average exceeds it; see
``scheduler.signal_check``), marked ``carbon_basis: "upper-bound"`` so it is never mistaken
for a measurement. Direct-mode receipts do the same (``scheduler.signed_region_receipt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.energy.embodied import EMBODIED_CATALOGUE
from scheduler.energy.output_budget import OutputBudget
from scheduler.errors import Attempt
from scheduler.signal_check import UPPER_BOUND_G_PER_KWH, signal_problem, value_problem
from scheduler.signed_region_receipt import energy_fields, number
from scheduler.types import Candidate, CarbonUsed, EnergyReceipt, Fallback, FleetSnapshot
from scheduler.units import J_PER_KWH

MODEL_ATTRIBUTION = "model-v1"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None

    @classmethod
    def from_region(cls, usage: Mapping[str, Any] | None) -> Usage:
        usage = usage or {}
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), _int(cached))


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class ReceiptInputs:
    decision_id: str
    request_id: str
    tenant: str
    candidate: Candidate
    snapshot: FleetSnapshot
    fallbacks: tuple[Fallback, ...]
    failovers: tuple[Attempt, ...]
    # The router's own count of the prompt's tokens, billed where the region reports nothing
    # (never the client's declared prompt or cached tokens).
    prompt_tokens: int
    usage: Mapping[str, Any] | None
    energy: Mapping[str, Any] | None
    ttft_ms: float | None
    duration_ms: float
    # Content events relayed to the client (the token count when the region sent no usage).
    relayed_events: int = 0
    # complete | cancelled | deadline | region-error; anything but complete is partial.
    end_reason: str = "complete"
    # The policy's output budget for the request (None: none applies).
    output_budget: OutputBudget | None = None
    # A request the deferral queue held: when it was released and why it was held.
    released_at: float | None = None
    deferral: str = ""


def _modelled_energy(inputs: ReceiptInputs, prompt: int, cached: int, completion: int) -> dict[str, Any]:
    perf = inputs.snapshot.perf[inputs.candidate.index]
    coefficients = perf.energy
    estimate = coefficients.estimate(prompt, cached, completion)
    avoided = coefficients.avoided_j(prompt, cached)
    return {
        "measurement_source": "model",
        # The rule version only: the ledger keys entries on it. The estimate's provenance
        # (profile or analytic) travels in the decision message.
        "attribution_method": MODEL_ATTRIBUTION,
        "energy_j": estimate.energy_j,
        "energy_j_low": estimate.low_j,
        "energy_j_high": estimate.high_j,
        "waiting_j": estimate.idle_j,
        "prefill_j": estimate.prefill_j,
        "decode_j": estimate.decode_j,
        "batch_size": perf.batch,
        "avoided_j": avoided,
    }


def build_receipt(inputs: ReceiptInputs) -> EnergyReceipt:
    usage = Usage.from_region(inputs.usage)
    estimated = usage.prompt_tokens is None or usage.completion_tokens is None
    prompt = usage.prompt_tokens if usage.prompt_tokens is not None else inputs.prompt_tokens
    cached = usage.cached_tokens if usage.cached_tokens is not None else 0
    completion = usage.completion_tokens if usage.completion_tokens is not None else inputs.relayed_events
    candidate, snapshot = inputs.candidate, inputs.snapshot
    # A plain vLLM region measures nothing: an energy object in its stream is not to be trusted.
    energy = (
        energy_fields(inputs.energy)
        if inputs.candidate.region.energy_measured and inputs.energy is not None
        and number(inputs.energy.get("energy_j")) is not None
        else _modelled_energy(inputs, prompt, cached, completion)
    )
    carbon_used = None
    signal = snapshot.carbon.get(candidate.region.grid_zone)
    intensity, basis = UPPER_BOUND_G_PER_KWH, "upper-bound"
    if signal is not None:
        problem = signal_problem(signal, snapshot.now, snapshot.policy.max_age.carbon)
        carbon_used = CarbonUsed(signal, snapshot.age(signal.observed_at), problem is not None)
        if problem is None:
            intensity, basis = signal.value, "signal"
        elif value_problem(signal) is None:
            intensity = max(intensity, signal.value)
    carbon_g = None
    if energy["energy_j"] is not None:
        carbon_g = energy["energy_j"] / J_PER_KWH * intensity * candidate.region.pue
    embodied_g, embodied_basis = _embodied(inputs, energy.get("batch_size"))
    if embodied_g is not None and carbon_g is not None and snapshot.policy.embodied_in_carbon:
        carbon_g += embodied_g
    return EnergyReceipt(
        decision_id=inputs.decision_id,
        request_id=inputs.request_id,
        tenant=inputs.tenant,
        model=candidate.deployment.name,
        region=candidate.region.name,
        pool=candidate.pool.name,
        precision=candidate.deployment.precision,
        pue=candidate.region.pue,
        prompt_tokens=prompt,
        completion_tokens=completion,
        reused_tokens=usage.cached_tokens,
        carbon_g=carbon_g,
        carbon=carbon_used,
        fallbacks=inputs.fallbacks,
        failovers=inputs.failovers,
        ttft_ms=inputs.ttft_ms,
        duration_ms=inputs.duration_ms,
        partial=inputs.end_reason != "complete",
        end_reason=inputs.end_reason,
        tokens_estimated=estimated,
        carbon_basis=basis,
        carbon_intensity_g_per_kwh=intensity,
        config_version=snapshot.config_version,
        canary_arm=snapshot.canary_arm,
        output_budget=inputs.output_budget,
        released_at=inputs.released_at,
        deferral=inputs.deferral,
        embodied_g=embodied_g,
        embodied_basis=embodied_basis,
        tickets_enforced=candidate.region.tickets_enforced,
        **energy,
    )


def _embodied(inputs: ReceiptInputs, batch: float | None) -> tuple[float | None, str]:
    """The request's share of its replica's embodied carbon (scheduler.energy.embodied): its
    GPUs for the stream's duration, shared with the batch it ran in (the reported one, else the
    decision's prediction)."""
    candidate = inputs.candidate
    entry = EMBODIED_CATALOGUE.get(candidate.gpu.name)
    if entry is None:
        return None, ""
    if batch is None:
        batch = inputs.snapshot.perf[candidate.index].batch
    tensor_parallel = candidate.deployment.tensor_parallel
    duration_s = inputs.duration_ms / 1000.0
    grams = entry.grams(tensor_parallel, duration_s, batch)
    return grams, f"{entry.describe()}; {tensor_parallel} GPU x {duration_s:.3g} s / batch {max(batch, 1.0):.3g}"
