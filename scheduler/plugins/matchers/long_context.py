"""Long-context matcher: long prompts go to large-HBM pools.

if request.prompt_tokens >= threshold_tokens:
    keep c  iff  c.gpu.hbm_gb >= min_hbm_gb
(when no large-HBM pool survived the filters, the framework keeps them all)
Parameters: threshold_tokens, min_hbm_gb. Reads: request.prompt_tokens, the GPUs' HBM from
the hardware catalogue (static columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from scheduler.framework.columns import BoolArray, FloatArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "long-context-matcher"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("hbm_gb",)
    hbm_gb: FloatArray


@dataclass(frozen=True)
class LongContextMatcher(Plugin):
    TYPE: ClassVar[str] = TYPE
    # Prompts at or above this many tokens go to pools with at least min_hbm_gb of HBM.
    threshold_tokens: Annotated[int, Field(gt=0)] = 32768
    min_hbm_gb: Annotated[float, Field(gt=0)] = 141.0

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        return Columns(np.asarray([c.gpu.hbm_gb for c in fleet.candidates], dtype=np.float64))

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        if view.request.prompt_tokens < self.threshold_tokens:
            return None
        keep: BoolArray = cols.hbm_gb >= self.min_hbm_gb
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        return "{:,}-token prompt goes to pools with >= {:.0f} GB HBM; {} has {:.0f} GB", (
            view.request.prompt_tokens, self.min_hbm_gb, c.gpu.name, c.gpu.hbm_gb,
        )
