"""The plain records the router, the regions and the SDK exchange: a signal, the carbon a
receipt rests on, a fallback, the energy receipt. Frozen dataclasses with no dependency beyond
the standard library and two pure modules, so that the SDK (``carbon-scheduler-sdk``) carries
them without the router's; ``scheduler.types`` re-exports them for the rest of the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.energy.output_budget import OutputBudget
from scheduler.errors import Attempt


@dataclass(frozen=True, slots=True)
class Signal:
    """A timestamped value from outside: grid carbon intensity, price, ...

    ``observed_at`` is the time the value describes; ``fetched_at`` when we got it.
    """

    kind: str
    key: str
    value: float
    unit: str
    observed_at: float
    fetched_at: float
    source: str
    is_forecast: bool = False
    is_estimated: bool = False
    confidence: float | None = None
    # How the provider estimated the value when ``is_estimated`` (e.g. Electricity Maps'
    # ``estimationMethod``); None when measured or unknown.
    estimation_method: str | None = None
    # What a carbon-intensity value describes: "average" (the grid mix's mean) or "marginal"
    # (the plants that answer one more kWh); its emission factors: "lifecycle" (plants' build,
    # fuel supply and operation) or "direct" (combustion only). "": the provider does not say.
    signal_type: str = ""
    emission_factors: str = ""


@dataclass(frozen=True, slots=True)
class Fallback:
    """A signal the decision could not use: which, how old, and the limit it passed. When the
    scorer priced the candidates that depend on it at a conservative bound (and ranking went
    on), the fallback says whose signal it was (``key``: a grid zone, a region), the bound and
    its unit, and those candidates (``region/pool``); otherwise ``bound`` is None."""

    signal: str
    scorer: str
    age_s: float | None  # None: never seen
    max_age_s: float
    detail: str = ""
    key: str = ""
    bound: float | None = None
    bound_unit: str = ""
    candidates: tuple[str, ...] = ()


@dataclass(frozen=True)
class CarbonUsed:
    """The carbon signal a receipt's grams rest on, with its age when the receipt was made."""

    signal: Signal
    age_s: float
    stale: bool


@dataclass(frozen=True)
class EnergyReceipt:
    """How much energy and carbon one request cost, how that was obtained and how sure it is
    (ARCHITECTURE section 6). A field nothing measured stays None."""

    decision_id: str
    request_id: str
    tenant: str
    model: str
    region: str
    pool: str
    pue: float
    measurement_source: str
    attribution_method: str
    energy_j: float | None = None
    energy_j_low: float | None = None
    energy_j_high: float | None = None
    confidence: float | None = None
    waiting_j: float | None = None
    prefill_j: float | None = None
    decode_j: float | None = None
    postprocess_j: float | None = None
    idle_allocation_j: float | None = None
    batch_size: float | None = None
    padding_ratio: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reused_tokens: int | None = None
    avoided_j: float | None = None
    carbon_g: float | None = None
    carbon: CarbonUsed | None = None
    fallbacks: tuple[Fallback, ...] = ()
    failovers: tuple[Attempt, ...] = ()
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    # False: the region finished. True: the stream ended early (end_reason says why) and the
    # tokens actually relayed are billed.
    partial: bool = False
    end_reason: str = "complete"  # complete | cancelled | deadline | region-error
    # True: the region reported no usage (a proxied stream cut before its final event), so the
    # router counted the tokens itself (prompt: from its bytes; completion: the content events
    # relayed), never from what the client declared. The region's own receipt, on the
    # engine's counts, then replaces it in the ledger.
    tokens_estimated: bool = False
    # "signal": carbon_g rests on a usable grid signal; "upper-bound": the signal was stale,
    # invalid or missing and carbon_g is a conservative bound, not a measurement.
    carbon_basis: str = ""
    carbon_intensity_g_per_kwh: float | None = None
    # The config version of the snapshot the request was decided on ("": not versioned).
    config_version: str = ""
    # The canary arm that served the request ("control" or "canary"; "": no canary).
    canary_arm: str = ""
    # The precision of the weights that served it (bf16, fp8, int4, ...; "": not known).
    precision: str = ""
    # The policy's quality-per-joule max_tokens for it (None: the policy has no table for it).
    output_budget: OutputBudget | None = None
    # When the deferral queue released it (None: not deferred), and why it was held
    # ("<reason>: <explanation>", as in the decision that held it; docs/deferral.md).
    released_at: float | None = None
    deferral: str = ""
    # The GPUs' embodied carbon for the request's share of its replica's GPU-seconds
    # (scheduler.energy.embodied), and the catalogue entry it rests on. Its own line: in
    # carbon_g only when the policy says so (``embodied_in_carbon``).
    embodied_g: float | None = None
    embodied_basis: str = ""
    # False: it ran on a plain vLLM region (kind "vllm", docs/byo-vllm.md), which checks no
    # dispatch ticket and measures no energy. The receipts regions sign come from gateways,
    # which enforce them.
    tickets_enforced: bool = True
