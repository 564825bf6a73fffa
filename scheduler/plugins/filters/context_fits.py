"""Context filter: prompt + output fit the deployment's context limit and KV memory.

need = prompt_tokens + max_tokens
keep c  iff  need <= c.kv_capacity_tokens, where
             kv_capacity_tokens = min(max_context,
                                      (HBM x 0.9 x tensor_parallel - weight bytes)
                                      / (2 x layers x kv_heads x head_dim x precision bytes))
Reads: request.prompt_tokens, request.max_tokens, the candidate's precomputed KV capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import BoolArray
from scheduler.framework.plugin import Reason, RequestView

TYPE = "context-fits"


@dataclass(frozen=True)
class ContextFitsFilter:
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView) -> BoolArray | None:
        need = view.request.prompt_tokens + view.request.max_tokens
        keep: BoolArray = view.cols.kv_capacity >= need
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        need = view.request.prompt_tokens + view.request.max_tokens
        if need > c.deployment.max_context:
            return "{:,} tokens exceed max_context {:,}", (need, c.deployment.max_context)
        per_token = c.model.kv_bytes_per_token_at(c.deployment.precision)
        return "KV for {:,} tokens needs {:.1f} GB > {:.1f} GB free", (
            need, need * per_token / 1e9, c.kv_capacity_tokens * per_token / 1e9,
        )
