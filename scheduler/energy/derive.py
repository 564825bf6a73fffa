"""How the shipped profiles were made, so that anyone can re-derive (and check) them.

No GPU measured these pools for this project; only one published absolute figure is used
as an anchor:

    ML.ENERGY Leaderboard v3.0 (vLLM 0.11.1): Llama 3.1 8B on one H100 at batch 64 spends
    about 0.12 J per output token (0.20 J with vLLM 0.5.4 in v2.0).

The first-principles terms (``model.first_principles`` with the default ``PhysicsAssumptions``)
of the anchor pool are scaled by one factor k so that the anchor's request (batch 64, context
512, output 256) costs 0.12 J per output token. Every other (model, GPU) profile is the same
physics times the same k: "scaled", not measured, and its interval is wider. ``idle_w`` is
the catalogue's execution-idle floor (not scaled). ``scheduler calibrate`` replaces a profile
with a measured one ("calibrated").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model import PhysicsAssumptions, first_principles, weights_read_ratio
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.profiles import EnergyProfile, Source, write_profile

DERIVED_ON = dt.date(2026, 11, 30)

ML_ENERGY_V3_LLAMA = Source(
    name="ML.ENERGY blog, 'LLM Inference Energy: A Longitudinal Analysis' (Leaderboard v2.0 -> v3.0)",
    url="https://ml.energy/blog/measurement/energy/llm-inference-energy-a-longitudinal-analysis",
    used_for="anchor: Llama 3.1 8B on H100 at batch size 64 uses 0.12 J per token with vLLM 0.11.1 "
    "(0.20 J with vLLM 0.5.4); CPU-side overheads waste static power at small batch",
)
ML_ENERGY_V3_DIAGNOSIS = Source(
    name="ML.ENERGY blog, 'Diagnosing Inference Energy Consumption with the ML.ENERGY Leaderboard v3.0'",
    url="https://ml.energy/blog/measurement/energy/diagnosing-inference-energy-consumption-with-the-mlenergy-leaderboard-v30",
    used_for="shape: decoding dominates response energy; longer outputs stress memory, limit batch size "
    "and raise energy per token (reasoning outputs ~10x longer, ~25x energy per response)",
)
SWEETSPOT = Source(
    name="Pizzini Cavagna et al., 'SweetSpot: An Analytical Model for Predicting Energy Efficiency of "
    "LLM Inference', arXiv:2602.05695",
    url="https://arxiv.org/abs/2602.05695",
    used_for="shape: energy is non-linear in input and output length (measured on H100, 1B-9B models); "
    "efficiency drops for long inputs and very short outputs",
)
SAMSI_2023 = Source(
    name="Samsi et al., 'From Words to Watts: Benchmarking the Energy Costs of Large Language Model "
    "Inference', IEEE HPEC 2023, arXiv:2310.03003",
    url="https://arxiv.org/abs/2310.03003",
    used_for="order-of-magnitude check only: a few joules per decoded token for LLaMA-65B sharded over "
    "V100/A100 GPUs (2023 software, not vLLM)",
)
CATALOGUE = Source(
    name="NVIDIA datasheets via scheduler/energy/hardware.py (bandwidth, BF16 FLOP/s, TDP, idle floor)",
    url="https://www.nvidia.com/en-us/data-center/h200/",
    used_for="scaling from the anchor pool to other GPUs (bandwidth, FLOP/s and power ratios)",
)


@dataclass(frozen=True)
class Anchor:
    model: str
    gpu: str
    precision: str
    tensor_parallel: int
    batch: int
    context: int
    output: int
    j_per_output_token: float


ML_ENERGY_ANCHOR = Anchor("llama-3.1-8b", "H100-80GB", "bf16", 1, 64, 512, 256, 0.12)


@dataclass(frozen=True)
class Target:
    model: str
    gpu: str
    tensor_parallel: int


# Tensor parallelism: the smallest power of two whose 90 % of HBM holds the BF16 weights
# with room left for KV cache.
TARGETS: tuple[Target, ...] = tuple(
    Target(model, gpu, tp)
    for model, tps in (
        ("llama-3.2-1b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("llama-3.2-3b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("llama-3.1-8b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("qwen3-32b", {"A100-40GB": 4, "A100-80GB": 2, "H100-80GB": 2, "H200-141GB": 1}),
        ("llama-3.1-70b", {"A100-40GB": 8, "A100-80GB": 4, "H100-80GB": 4, "H200-141GB": 2}),
    )
    for gpu, tp in tps.items()
)
# Interval half-widths: the anchor pool itself; other models on the anchor's GPU generation
# (Hopper); another generation (Ampere), where no figure anchors the software efficiency.
REL_ERROR_ANCHOR = 0.2
REL_ERROR_SAME_GENERATION = 0.3
REL_ERROR_OTHER_GENERATION = 0.4
HOPPER = frozenset({"H100-80GB", "H200-141GB"})


def anchor_factor(anchor: Anchor = ML_ENERGY_ANCHOR, physics: PhysicsAssumptions | None = None) -> float:
    """k such that physics x k reproduces the anchor's J per output token."""
    model, gpu = MODEL_CATALOGUE[anchor.model], GPU_CATALOGUE[anchor.gpu]
    replica = first_principles(model, gpu, anchor.precision, anchor.tensor_parallel, physics or PhysicsAssumptions())
    coefficients = replica.at_batch(anchor.batch, weights_read_ratio(model, anchor.batch), 0.0, "physics")
    per_token = coefficients.joules(anchor.context, 0, anchor.output) / anchor.output
    return anchor.j_per_output_token / per_token


def derive_profiles(targets: Sequence[Target] = TARGETS, anchor: Anchor = ML_ENERGY_ANCHOR) -> list[EnergyProfile]:
    physics = PhysicsAssumptions()
    k = anchor_factor(anchor, physics)
    profiles = []
    for t in targets:
        replica = first_principles(MODEL_CATALOGUE[t.model], GPU_CATALOGUE[t.gpu], "bf16", t.tensor_parallel, physics)
        is_anchor = (t.model, t.gpu, t.tensor_parallel) == (anchor.model, anchor.gpu, anchor.tensor_parallel)
        sources = [ML_ENERGY_V3_LLAMA, ML_ENERGY_V3_DIAGNOSIS, SWEETSPOT, CATALOGUE]
        if t.model == "llama-3.1-70b" and t.gpu not in HOPPER:
            sources.append(SAMSI_2023)
        profiles.append(
            EnergyProfile(
                model=t.model,
                gpu=t.gpu,
                precision="bf16",
                tensor_parallel=t.tensor_parallel,
                method="anchored" if is_anchor else "scaled",
                date=DERIVED_ON,
                rel_error=REL_ERROR_ANCHOR if is_anchor
                else REL_ERROR_SAME_GENERATION if t.gpu in HOPPER else REL_ERROR_OTHER_GENERATION,
                replica=replica.scaled(k),
                sources=tuple(sources),
                path="",
            )
        )
    return profiles


def derivation_note(profile: EnergyProfile, k: float, anchor: Anchor = ML_ENERGY_ANCHOR) -> str:
    what = (
        "anchored: the published figure itself"
        if profile.method == "anchored"
        else f"scaled from the anchor pool ({anchor.model} on {anchor.gpu}); not measured on this pool"
    )
    return (
        f"{what}. Terms = scheduler.energy.model.first_principles(PhysicsAssumptions()) x k, "
        f"k = {k:.4f} fitted so that {anchor.model} / {anchor.gpu} / {anchor.precision} at batch "
        f"{anchor.batch}, context {anchor.context}, output {anchor.output} costs "
        f"{anchor.j_per_output_token} J per output token; idle_w from the hardware catalogue x TP. "
        f"Re-derive with `scheduler energy derive-profiles`; replace with `scheduler calibrate`."
    )


def write_derived_profiles(folder: Path) -> list[Path]:
    k = anchor_factor()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for profile in derive_profiles():
        path = folder / profile_filename(profile.model, profile.gpu)
        write_profile(profile, derivation_note(profile, k), path)
        written.append(path)
    return written


def profile_filename(model: str, gpu: str) -> str:
    return f"{model}__{gpu}.yaml"
