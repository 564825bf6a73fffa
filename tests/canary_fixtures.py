"""Policies for the canary tests (docs/canary.md): a control and the candidates it canaries.

- ``steady``, the control: the fastest first token first. From New York it picks us-east.
- ``thrifty``, a candidate: the cheapest electricity first: eu-north, wherever the client is.
- ``frugal``, a candidate that would break a hard limit if it could: the fewest joules, no
  sensitive task classes and an fp8 floor, so on its own it sends a medical prompt to
  us-east's fp8 pool (the canary arm may not).

Every region that publishes no live state is trusted (``missing: assume-healthy``): the stub
regions never publish. The interactive TTFT SLO is 600 ms, flat, so a region that waits a
second before its first token misses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_COMMON = """max_age: {carbon: 2h, region_state: 5s, price: 1d}
fallback:
  scorers:
    - {type: ttft-scorer, rate: 1 USD/h}
unknown_region_state: {stale: unhealthy, missing: assume-healthy, missing_warmup: 30s}
slo:
  interactive: {ttft_ms: 600, ttft_ms_per_1k_prompt_tokens: 0, tpot_ms: 100}
  batch: {ttft_ms: 30000, ttft_ms_per_1k_prompt_tokens: 300, tpot_ms: 500}
  deferrable: {ttft_ms: 3600000, ttft_ms_per_1k_prompt_tokens: 0, tpot_ms: 2000}
"""

STEADY = """name: steady
description: the control - the fastest first token first
scorers:
  - {type: ttft-scorer, rate: 1 USD/h}
""" + _COMMON + """sensitive_task_classes: [medical, legal]
"""

THRIFTY = """name: thrifty
description: a candidate - the cheapest electricity first
scorers:
  - {type: price-scorer, rate: 1000000}
  - {type: ttft-scorer, rate: 0.01 USD/h}
""" + _COMMON + """sensitive_task_classes: [medical, legal]
"""

FRUGAL = """name: frugal
description: a candidate - the fewest joules, quantized where it may
scorers:
  - {type: energy-scorer, rate: 0.001 USD/J}
""" + _COMMON + """sensitive_task_classes: []
precision_floor: {interactive: fp8, batch: fp8, deferrable: int4}
"""

# The canary section the control gets unless a test gives its own.
CANARY: dict[str, Any] = {
    "arm": "thrifty",
    "fraction": 0.5,
    "assign_by": "request_id",
    "rollback": {
        "window": "10s",
        "min_requests": 8,
        "ttft_slo_attainment": {"min": 0.8, "max_drop": 0.1},
        "error_rate": {"max": 0.2},
    },
}


def write_policies(directory: Path, canary: dict[str, Any] | None = CANARY) -> Path:
    """The three policies in ``directory`` (made if needed), ``steady`` with ``canary``."""
    directory.mkdir(parents=True, exist_ok=True)
    steady = STEADY if canary is None else STEADY + yaml.safe_dump({"canary": canary}, sort_keys=False)
    for name, text in (("steady", steady), ("thrifty", THRIFTY), ("frugal", FRUGAL)):
        (directory / f"{name}.yaml").write_text(text)
    return directory
