"""The model catalogue: the architecture facts that memory and energy depend on.

Values from each model's published ``config.json`` (Hugging Face model cards).
``active_params_b`` differs from ``params_b`` only for mixture-of-experts models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Bytes per weight / KV element for each serving precision.
PRECISION_BYTES: Mapping[str, float] = MappingProxyType(
    {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
)
# Higher is more faithful to the trained weights; used by the sensitive-task rule.
PRECISION_RANK: Mapping[str, int] = MappingProxyType(
    {"fp32": 5, "bf16": 4, "fp16": 4, "fp8": 3, "int8": 3, "int4": 1}
)

# The KV-cache precision a deployment at each weight precision runs with. FP8 deployments
# use vLLM's FP8 KV cache; weight-only INT8/INT4 (AWQ/GPTQ, W8A16/W4A16) keeps a 16-bit cache.
KV_PRECISION: Mapping[str, str] = MappingProxyType(
    {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "bf16", "int4": "bf16"}
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    max_context: int
    active_params_b: float | None = None

    @property
    def active_b(self) -> float:
        return self.active_params_b if self.active_params_b is not None else self.params_b

    def kv_bytes_per_token(self, kv_precision: str) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * PRECISION_BYTES[kv_precision]

    def kv_bytes_per_token_at(self, weight_precision: str) -> float:
        """KV bytes per token of a deployment whose weights are at ``weight_precision``."""
        return self.kv_bytes_per_token(KV_PRECISION[weight_precision])

    def weight_bytes(self, precision: str) -> float:
        return self.params_b * 1e9 * PRECISION_BYTES[precision]


MODEL_CATALOGUE: Mapping[str, ModelSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ModelSpec("llama-3.2-1b", params_b=1.24, layers=16, hidden=2048, kv_heads=8, head_dim=64, max_context=131072),
            ModelSpec("llama-3.2-3b", params_b=3.21, layers=28, hidden=3072, kv_heads=8, head_dim=128, max_context=131072),
            ModelSpec("llama-3.1-8b", params_b=8.03, layers=32, hidden=4096, kv_heads=8, head_dim=128, max_context=131072),
            ModelSpec("llama-3.1-70b", params_b=70.6, layers=80, hidden=8192, kv_heads=8, head_dim=128, max_context=131072),
            ModelSpec("qwen3-32b", params_b=32.8, layers=64, hidden=5120, kv_heads=8, head_dim=128, max_context=131072),
            # The tiny Llama the project generates locally for CPU tests and the demo.
            ModelSpec("tiny-llama", params_b=0.000584, layers=2, hidden=128, kv_heads=4, head_dim=32, max_context=2048),
        )
    }
)
