"""The example fleets of docs/simulation.md load and check, and the tight-SLO fleet's policies
are the shipped ones with only the interactive TTFT SLO changed (a copy that drifts would
evaluate a policy nobody ships)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.config.loader import EMBEDDED_POLICIES
from scheduler.plugins.checked_fleet import load_checked_fleet

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "fleets"


@pytest.mark.parametrize("fleet", ["clean-edges", "tight-slo"])
def test_example_fleet_loads(fleet: str) -> None:
    policies = EXAMPLES / fleet / "policies"
    loaded = load_checked_fleet(EXAMPLES / fleet / "regions", policies if policies.is_dir() else None)
    assert len(loaded.regions) >= 6
    assert {"default", "latency-first", "carbon-first"} <= set(loaded.policies)


def test_tight_slo_policies_differ_from_the_shipped_ones_only_in_the_interactive_slo() -> None:
    shipped = load_checked_fleet(policies_dir=EMBEDDED_POLICIES).policies
    tight = load_checked_fleet(EXAMPLES / "tight-slo" / "regions", EXAMPLES / "tight-slo" / "policies").policies
    assert set(tight) == set(shipped)
    for name, policy in tight.items():
        assert policy.slo.interactive.ttft_ms == 500
        ours = json.loads(policy.model_dump_json())
        theirs = json.loads(shipped[name].model_dump_json())
        del ours["slo"]["interactive"], theirs["slo"]["interactive"]
        assert ours == theirs, name
