"""Context filter: prompt + output fit the deployment's context limit and KV memory.

need = prompt_tokens + max_tokens
keep c  iff  need <= c.kv_capacity_tokens, where
             kv_capacity_tokens = min(max_context,
                                      (HBM x 0.9 x tensor_parallel - weight bytes)
                                      / (2 x layers x kv_heads x head_dim x precision bytes))
Reads: request.prompt_tokens, request.max_tokens, the candidates' KV capacity (static columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "context-fits"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("kv_capacity",)
    kv_capacity: FloatArray

    @cached_property
    def smallest(self) -> float:
        """The least KV capacity of these candidates: a request that needs no more fits all."""
        return float(self.kv_capacity.min()) if len(self.kv_capacity) else float("inf")


@dataclass(frozen=True)
class ContextFitsFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        return Columns(np.asarray([c.kv_capacity_tokens for c in fleet.candidates], dtype=np.float64))

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        need = view.request.prompt_tokens + view.request.max_tokens
        if need <= cols.smallest:
            return None
        keep: BoolArray = cols.kv_capacity >= need
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        need = view.request.prompt_tokens + view.request.max_tokens
        if need > c.deployment.max_context:
            return "{:,} tokens exceed max_context {:,}", (need, c.deployment.max_context)
        per_token = c.model.kv_bytes_per_token_at(c.deployment.precision)
        return "KV for {:,} tokens needs {:.1f} GB > {:.1f} GB free", (
            need, need * per_token / 1e9, c.kv_capacity_tokens * per_token / 1e9,
        )
