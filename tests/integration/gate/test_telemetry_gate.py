"""The telemetry gate with what regions really publish: a local region without a GPU meter
(eu-north's h200-long: its receipts say ``model`` and its live state has no GPU power) and one
with a meter (us-east's h100-chat: ``nvml``, GPU power published). Under a policy with
``telemetry_gate: {modelled_only: canary-only}`` and a canary on half the requests, the
modelled pool serves canary requests only, although the control's objective (the fastest
first token, for clients in Oslo) would pick it first; once listed as passed, control
requests go there too.

Real: both region gateways (their receipts and their ``live_state``), the snapshot builder, the
canary runtime (over an in-memory store) and its assignment, the scheduler with every
registered plugin. Not real: the engines and the metered GPU (local_region.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
import pytest
import yaml

from scheduler.canary.assign import CANARY, CONTROL, snapshot_for
from scheduler.canary.runtime import CanaryRuntime
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import FleetConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.gate.measure import Target, send
from scheduler.gate.request_set import calls, load_request_set
from scheduler.gate.stats import Sample
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.state.memory_store import MemoryStore
from scheduler.types import FleetSnapshot, GeoPoint, RegionLiveState, Request
from tests.canary_fixtures import write_policies
from tests.integration.gate.local_region import LocalRegion

pytestmark = pytest.mark.integration

MODELLED, METERED = "eu-north/h200-long", "us-east/h100-chat"
OSLO = GeoPoint(lat=59.91, lon=10.75)
DIGEST = "cd" * 32


def fleet_with_gate(directory: Path, passed: list[dict[str, str]]) -> FleetConfig:
    """The canary fixtures' policies, the control (``steady``) with a telemetry gate."""
    policies = write_policies(directory)
    steady = policies / "steady.yaml"
    raw = yaml.safe_load(steady.read_text())
    steady.write_text(yaml.safe_dump({**raw, "telemetry_gate": {"modelled_only": "canary-only", "passed": passed}}))
    return load_checked_fleet(policies_dir=policies)


async def snapshot_of(fleet: FleetConfig, live: dict[str, RegionLiveState]) -> FleetSnapshot:
    policies = {name: compile_policy(each) for name, each in fleet.policies.items()}
    policy = policies["steady"]
    regions = tuple(r for r in fleet.regions if r.name in live)
    runtime = CanaryRuntime(MemoryStore(), policies, host_id="gate-test")
    await runtime.refresh(policy)
    return runtime.attach(SnapshotBuilder(compile_fleet(regions), policy).build(time.time(), live=live))


def decide(fleet: FleetConfig, live: dict[str, RegionLiveState], n: int) -> dict[str, list[str]]:
    """Arm -> the place chosen for each of ``n`` requests from Oslo."""
    snapshot = asyncio.run(snapshot_of(fleet, live))
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(7))
    chosen: dict[str, list[str]] = {CONTROL: [], CANARY: []}
    for i in range(n):
        request = Request(request_id=f"gate-{i}", model="llama-3.1-8b", prompt_tokens=400, max_tokens=64,
                          client_location=OSLO)
        decision = scheduler.schedule(request, snapshot_for(request, snapshot))
        assert decision.chosen is not None, decision.rejected
        chosen[decision.canary_arm].append(decision.chosen.candidate.key)
        if decision.canary_arm == CONTROL and MODELLED not in chosen[CONTROL]:
            gated = [r for r in decision.rejected if r.candidate.key == MODELLED]
            assert gated == [] or (gated[0].plugin == "telemetry-gate" and "canary traffic only" in gated[0].reason)
    return chosen


def receipt(region: LocalRegion) -> Sample:
    """The receipt of one short chat on the region's pool."""
    request_set = load_request_set("local")
    call = calls(request_set, request_set.bucket("short-chat"), 0, pool=region.pool)[0]

    async def run() -> Sample:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return await send(client, Target(url=region.url, pool=region.pool), call, region.region.name)

    return asyncio.run(run())


def wait_metered(region: LocalRegion) -> RegionLiveState:
    """The region's state once its meter has read the GPU (its first reading: ~0.2 s)."""
    deadline = time.monotonic() + 10.0
    while True:
        state = region.live_state()
        if all(p.gpu_power_w is not None for p in state.pools.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_a_pool_with_modelled_energy_only_gets_canary_traffic_only(tmp_path: Path) -> None:
    shipped = {r.name: r for r in load_checked_fleet().regions}
    with LocalRegion(shipped["eu-north"], "h200-long", max_num_seqs=8, metered=False) as modelled, \
            LocalRegion(shipped["us-east"], "h100-chat", max_num_seqs=8) as metered:
        live = {"eu-north": modelled.live_state(), "us-east": wait_metered(metered)}
        receipts = {MODELLED: receipt(modelled), METERED: receipt(metered)}
    assert receipts[MODELLED].measurement_source == "model" and receipts[METERED].measurement_source == "nvml"
    assert live["eu-north"].pools["h200-long"].gpu_power_w is None
    assert live["us-east"].pools["h100-chat"].gpu_power_w is not None

    gated = decide(fleet_with_gate(tmp_path / "gated", passed=[]), live, 200)
    assert len(gated[CANARY]) > 50 and len(gated[CONTROL]) > 50
    assert MODELLED not in gated[CONTROL]
    assert MODELLED in gated[CANARY]

    passed = decide(fleet_with_gate(tmp_path / "passed", passed=[{"pool": MODELLED, "measurement_sha256": DIGEST}]),
                    live, 200)
    # Passed: the control's fastest first token from Oslo is eu-north's.
    assert set(passed[CONTROL]) == {MODELLED}

