"""A bucket's J per output token from its receipts, with an interval (docs/gate.md).

Per sample i (one stream and its receipt): x_i = energy_j / completion_tokens, and the
receipt's bounds per token lo_i = energy_j_low / completion_tokens, hi_i = energy_j_high /
completion_tokens.

    mean   = sum x_i / n
    spread = t(0.975, n - 1) x sd(x) / sqrt(n)      the sample mean's 95 % half-width
    low    = sum lo_i / n - spread
    high   = sum hi_i / n + spread

The receipts' bounds are averaged, not narrowed by sqrt(n): their errors (the energy model's
ratio error in the split of a GPU's joules, the meter's resolution, or the model's own
interval where nothing metered) are of the same kind for every sample and not known to
cancel, so they count as fully correlated. The spread (how the samples differ: lengths,
batch neighbours, timing) widens each side. With fewer than two samples there is no spread:
low and high are None, and compare fails such a bucket.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Student's t, 97.5 % quantile, for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 97.5 % quantile; beyond the table, z + (z^3 + z) / (4 df) (within 0.002)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class Sample:
    """One stream's receipt, as ``gate measure`` records it."""

    energy_j: float
    energy_j_low: float
    energy_j_high: float
    completion_tokens: int
    prompt_tokens: int
    measurement_source: str
    attribution_method: str
    # "region/pool" from a router's receipt; the pool a region answered from otherwise.
    place: str
    batch_size: float | None = None
    config_version: str = ""

    @property
    def j_per_token(self) -> float:
        return self.energy_j / self.completion_tokens


@dataclass(frozen=True)
class BucketSummary:
    n: int
    completion_tokens: int
    mean_j_per_token: float | None
    sd_j_per_token: float | None
    # The sample mean's 95 % half-width (module doc).
    spread_j_per_token: float | None
    receipt_low_j_per_token: float | None
    receipt_high_j_per_token: float | None
    low_j_per_token: float | None
    high_j_per_token: float | None
    sources: dict[str, int]
    attribution_methods: dict[str, int]
    places: dict[str, int]
    config_versions: list[str]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarise(samples: Sequence[Sample]) -> BucketSummary:
    n = len(samples)
    x = [s.j_per_token for s in samples]
    mean = sum(x) / n if n else None
    sd = spread = low = high = receipt_low = receipt_high = None
    if n:
        receipt_low = sum(s.energy_j_low / s.completion_tokens for s in samples) / n
        receipt_high = sum(s.energy_j_high / s.completion_tokens for s in samples) / n
    if n >= 2 and mean is not None and receipt_low is not None and receipt_high is not None:
        sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
        spread = t975(n - 1) * sd / math.sqrt(n)
        low, high = max(0.0, receipt_low - spread), receipt_high + spread
    return BucketSummary(
        n=n, completion_tokens=sum(s.completion_tokens for s in samples),
        mean_j_per_token=mean, sd_j_per_token=sd, spread_j_per_token=spread,
        receipt_low_j_per_token=receipt_low, receipt_high_j_per_token=receipt_high,
        low_j_per_token=low, high_j_per_token=high,
        sources=dict(Counter(s.measurement_source for s in samples)),
        attribution_methods=dict(Counter(s.attribution_method for s in samples)),
        places=dict(Counter(s.place for s in samples)),
        config_versions=sorted({s.config_version for s in samples if s.config_version}),
    )


def stable(summary: BucketSummary, target: float) -> bool:
    """Whether the mean is stable: its spread at most ``target`` of it (``Rounds.target``)."""
    if summary.spread_j_per_token is None or not summary.mean_j_per_token:
        return False
    return summary.spread_j_per_token <= target * summary.mean_j_per_token
