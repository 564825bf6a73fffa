"""The telemetry-gate filter, table-driven: which pools a snapshot's requests may use when
some regions publish no GPU power (their energy only modelled), on each canary arm."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.config.schema import GatePass, PolicyConfig, TelemetryGate
from scheduler.framework.predict import request_view
from scheduler.framework.state import prepared, selected
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.filters.telemetry_gate import TelemetryGateFilter
from scheduler.types import PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, region

DIGEST = "ab" * 32
METERED = PoolLiveState(gpu_power_w=420.0)
MODELLED = PoolLiveState()  # the gateway without a meter publishes no GPU power


def live(name: str, state: PoolLiveState, age_s: float = 0.0) -> RegionLiveState:
    return RegionLiveState(region=name, healthy=True, observed_at=NOW - age_s, pools={"h100": state})


@dataclass
class Case:
    name: str
    gate: TelemetryGate | None
    arm: str
    kept: set[str]
    live: list[RegionLiveState] = field(default_factory=list)


CANARY_ONLY = TelemetryGate(modelled_only="canary-only")
BOTH_LIVE = [live("metered", METERED), live("modelled", MODELLED)]
CASES = [
    Case("no gate: every pool", None, "control", {"metered/h100", "modelled/h100"}, BOTH_LIVE),
    Case("gate allows modelled pools", TelemetryGate(modelled_only="allow"), "control",
         {"metered/h100", "modelled/h100"}, BOTH_LIVE),
    Case("control arm: the metered pool only", CANARY_ONLY, "control", {"metered/h100"}, BOTH_LIVE),
    Case("canary arm: every pool", CANARY_ONLY, "canary", {"metered/h100", "modelled/h100"}, BOTH_LIVE),
    Case("no canary configured: modelled pools take nothing", CANARY_ONLY, "", {"metered/h100"}, BOTH_LIVE),
    Case("passed the gate: the modelled pool too",
         TelemetryGate(modelled_only="canary-only", passed=(GatePass(pool="modelled/h100", measurement_sha256=DIGEST),)),
         "control", {"metered/h100", "modelled/h100"}, BOTH_LIVE),
    Case("another pool passed: still gated",
         TelemetryGate(modelled_only="canary-only", passed=(GatePass(pool="modelled/a100", measurement_sha256=DIGEST),)),
         "control", {"metered/h100"}, BOTH_LIVE),
    Case("a region never seen counts as modelled", CANARY_ONLY, "control", {"metered/h100"},
         [live("metered", METERED)]),
    Case("an old state still says it meters", CANARY_ONLY, "control", {"metered/h100"},
         [live("metered", METERED, age_s=3600.0), live("modelled", MODELLED)]),
]


def policy_with(policy: PolicyConfig, gate: TelemetryGate | None) -> PolicyConfig:
    return policy.model_copy(update={"telemetry_gate": gate})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_telemetry_gate(case: Case, make_snapshot, default_policy: PolicyConfig) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("metered"), region("modelled")], live=case.live,
                             policy=policy_with(default_policy, case.gate))
    snapshot = dataclasses.replace(snapshot, canary_arm=case.arm, live_key=object())
    request = Request(request_id="t", model="llama-3.1-8b", prompt_tokens=500, max_tokens=100)
    base, _ = selected(ModelIndex(), request, snapshot)
    plugin = TelemetryGateFilter()
    view = request_view(request, snapshot, base)
    cols = prepared(plugin, snapshot, base)
    keep = plugin.keep(view, cols)
    mask = np.ones(len(base), dtype=bool) if keep is None else keep
    keys = [snapshot.candidates[i].key for i in base]
    assert {k for k, m in zip(keys, mask, strict=True) if m} == case.kept
    for position, key in enumerate(keys):
        if not mask[position]:
            fmt, args = plugin.reason(view, cols, position)
            assert fmt.format(*args).startswith(f"{key}: energy only modelled") and "canary traffic only" in fmt


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("section", "fragment"), [
    ({"modelled_only": "sometimes"}, "telemetry_gate.modelled_only"),
    ({"modelled_only": "canary-only", "passed": [{"pool": "eu-north", "measurement_sha256": DIGEST}]},
     "telemetry_gate.passed[0].pool"),
    ({"modelled_only": "canary-only", "passed": [{"pool": "eu-north/h200-long", "measurement_sha256": "abc"}]},
     "telemetry_gate.passed[0].measurement_sha256"),
    ({"modelled_only": "canary-only", "passed": [{"pool": "eu-north/h200-long", "measurement_sha256": DIGEST}] * 2},
     "a pool is listed twice"),
])
def test_policy_errors_name_the_file_and_field(section: dict[str, object], fragment: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from scheduler.config.loader import PROJECT_DIR, ConfigError, load_policy

    raw = yaml.safe_load((PROJECT_DIR / "policies" / "default.yaml").read_text())
    path = tmp_path / "default.yaml"
    path.write_text(yaml.safe_dump({**raw, "telemetry_gate": section}))
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value)
