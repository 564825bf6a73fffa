"""The scorer that docs/objective.md shows how to add works as written: one file (the page's
first Python block), one registration line, one policy entry."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

from scheduler.config.loader import validate
from scheduler.config.schema import PolicyConfig
from scheduler.framework.registry import Registry
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import register_all
from scheduler.testing import region, request, shipped_policy, snapshot

DOC = Path(__file__).resolve().parents[3] / "docs" / "objective.md"


def test_the_documented_scorer_registers_prices_and_decides() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    module = types.ModuleType("generation_time")
    sys.modules["generation_time"] = module  # dataclasses resolve annotations through it
    try:
        exec(compile(blocks[0], str(DOC), "exec"), module.__dict__)
        registry = register_all(Registry())
        registration = blocks[1].strip().replace("generation_time.", "module.")
        exec(registration, {"registry": registry, "module": module})
        raw = json.loads(shipped_policy("default").model_dump_json())
        raw["scorers"].append({"type": "generation-time-scorer",
                               "rate": {"interactive": "0.2 USD/h", "batch": "0.01 USD/h", "deferrable": 0}})
        policy = validate(PolicyConfig, raw, "<doc example>")
        assert registry.check(policy, "<doc example>") == []
        snap = snapshot(region("near", lat=40.7, lon=-74.0, carbon=300), region("far", lat=35.7, lon=139.7, carbon=300),
                        policy=policy)
        decision = Scheduler.from_registry(registry).schedule(request(client=(40.7, -74.0)), snap)
        assert "generation-time-scorer" in decision.scorer_names
        chosen = decision.chosen
        assert chosen is not None and chosen.candidate.region.name == "near"
        assert chosen.quantities["generation-time-scorer"] > chosen.quantities["ttft-scorer"]
    finally:
        del sys.modules["generation_time"]
