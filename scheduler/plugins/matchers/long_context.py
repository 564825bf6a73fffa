"""Long-context matcher: long prompts go to large-HBM pools.

if request.prompt_tokens >= policy.long_context.threshold_tokens:
    keep c  iff  c.gpu.hbm_gb >= policy.long_context.min_hbm_gb
(when no large-HBM pool survived the filters, the framework keeps them all)
Reads: request.prompt_tokens, policy.long_context, the GPU's HBM from the hardware catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import BoolArray
from scheduler.framework.plugin import Reason, RequestView

TYPE = "long-context-matcher"


@dataclass(frozen=True)
class LongContextMatcher:
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView) -> BoolArray | None:
        rule = view.snapshot.policy.long_context
        if view.request.prompt_tokens < rule.threshold_tokens:
            return None
        keep: BoolArray = view.cols.hbm_gb >= rule.min_hbm_gb
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        rule = view.snapshot.policy.long_context
        c = view.snapshot.candidates[view.base[position]]
        return "{:,}-token prompt goes to pools with >= {:.0f} GB HBM; {} has {:.0f} GB", (
            view.request.prompt_tokens, rule.min_hbm_gb, c.gpu.name, c.gpu.hbm_gb,
        )
