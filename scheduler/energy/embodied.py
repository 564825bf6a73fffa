"""Embodied carbon: what making a GPU emitted, amortised over the seconds of its service life,
as its own receipt line (never added to operational carbon unless a policy says so:
``PolicyConfig.embodied_in_carbon``).

    g per GPU-second = kgCO2e x 1000 / (lifetime_years x 365.25 x 86,400 s)
    embodied_g       = g per GPU-second x tensor_parallel x duration_s / batch

A request holds its replica's ``tensor_parallel`` GPUs for ``duration_s`` together with the
``batch`` sequences it shares them with, so it is charged its share of those GPU-seconds.

The catalogue (cradle-to-gate, per GPU, including its share of the host it sits in):

    A100-40GB  318 kgCO2e   Chien et al., "Reducing the Carbon Impact of Generative AI
               Inference (today and in 2035)", HotCarbon '23, https://doi.org/10.1145/3604930.3605705:
               1/8 of an 8 x A100 (40 GB) instance's GPUs, CPUs, DRAM, storage and packaging.
    others     scaled from that figure, half by logic die area and half by memory capacity:
               318 x (0.5 x die_mm2 / 826 + 0.5 x memory_gb / 40), with the dies of NVIDIA's
               whitepapers (A100 826 mm2, H100/H200 814 mm2, B200 two dies of ~800 mm2,
               L4 294 mm2). An estimate, marked "scaled" on every receipt: no vendor publishes
               per-GPU figures for them.

The lifetime is the declared service life the figure is spread over (5 years: a common server
depreciation period).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

SECONDS_PER_YEAR = 365.25 * 86400.0
LIFETIME_YEARS = 5.0
_A100_KG, _A100_DIE_MM2, _A100_MEMORY_GB = 318.0, 826.0, 40.0
_SOURCE = "Chien et al. 2023 (HotCarbon '23)"


@dataclass(frozen=True, slots=True)
class EmbodiedCarbon:
    gpu: str
    kg_co2e: float
    # "cited": the source's own figure; "scaled": derived from it (module docstring)
    method: str
    source: str = _SOURCE
    lifetime_years: float = LIFETIME_YEARS

    @property
    def g_per_gpu_second(self) -> float:
        return self.kg_co2e * 1000.0 / (self.lifetime_years * SECONDS_PER_YEAR)

    def grams(self, tensor_parallel: int, duration_s: float, batch: float) -> float:
        """The request's share of its replica's GPU-seconds (module docstring)."""
        return self.g_per_gpu_second * tensor_parallel * max(0.0, duration_s) / max(batch, 1.0)

    def describe(self) -> str:
        return (f"{self.gpu}: {self.kg_co2e:.0f} kgCO2e over {self.lifetime_years:g} y "
                f"({self.method}, {self.source})")


def _scaled(gpu: str, die_mm2: float, memory_gb: float) -> EmbodiedCarbon:
    factor = 0.5 * die_mm2 / _A100_DIE_MM2 + 0.5 * memory_gb / _A100_MEMORY_GB
    return EmbodiedCarbon(gpu, round(_A100_KG * factor, 1), "scaled")


EMBODIED_CATALOGUE: Mapping[str, EmbodiedCarbon] = MappingProxyType({
    entry.gpu: entry
    for entry in (
        EmbodiedCarbon("A100-40GB", _A100_KG, "cited"),
        _scaled("A100-80GB", 826.0, 80.0),
        _scaled("H100-80GB", 814.0, 80.0),
        _scaled("H200-141GB", 814.0, 141.0),
        _scaled("L4", 294.0, 24.0),
        _scaled("B200", 1600.0, 180.0),
    )
})
