"""``scheduler gate measure`` through a router's HTTP front door: the receipts come in the
``energy_receipt`` event after ``[DONE]`` and name the region and pool; the same local region
measured through the router and directly gives J/token that ``gate compare`` does not tell
apart.

Real: the router (its front door, decision, dispatch and receipts, on port 0, in-memory store),
the region gateway behind it and its metered split, HTTP, the ``scheduler`` command. Not real
(local_region.py): the engine and the GPU, and the counter's lag set to the fake's step. The
region publishes no live state (no store), so the router's policy trusts regions it has not
seen (``unknown_region_state.missing: assume-healthy``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import UnknownRegionState
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy import nvml
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.server.app import build_deps, start_router
from scheduler.state.memory_store import MemoryStore
from tests.integration.gate.local_region import STEP_S, LocalRegion

pytestmark = pytest.mark.integration

QUICK_SET = Path(__file__).with_name("quick_set.yaml")
POOL = "h100-chat"


@pytest.mark.timeout(90)
async def test_measure_through_a_router_matches_the_region_measured_directly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(nvml.READING_LAG_S, nvml.COUNTER, STEP_S)
    fleet = load_checked_fleet()
    shipped = next(r for r in fleet.regions if r.name == "us-east")
    policy = fleet.policy("default").model_copy(update={"unknown_region_state": UnknownRegionState(
        stale="unhealthy", missing="assume-healthy", missing_warmup=30.0)})
    with LocalRegion(shipped, POOL, max_num_seqs=8) as local:
        # The router sees the region as the one pool it serves here, at the local endpoint.
        region = shipped.model_copy(update={"endpoint": local.url, "local": None,
                                            "pools": tuple(p for p in shipped.pools if p.name == POOL)})
        deps = build_deps(SnapshotBuilder(compile_fleet((region,)), compile_policy(policy)), MemoryStore(), "memory")
        deps.http_port = 0
        router = await start_router("127.0.0.1:0", deps)
        try:
            via_router = await asyncio.to_thread(main, [
                "gate", "measure", "--against", f"http://127.0.0.1:{router.http_port}", "--requests", str(QUICK_SET),
                "--out", str(tmp_path / "router.json"), "--quiet"])
        finally:
            await router.stop(grace_s=0.5)
        direct = await asyncio.to_thread(main, [
            "gate", "measure", "--against", local.url, "--pool", POOL, "--requests", str(QUICK_SET),
            "--out", str(tmp_path / "direct.json"), "--quiet"])
    assert via_router == 0 and direct == 0
    result = json.loads((tmp_path / "router.json").read_text())
    for bucket in result["buckets"].values():
        assert bucket["places"] == {f"us-east/{POOL}": bucket["n"]} and bucket["sources"] == {"nvml": bucket["n"]}
        assert all(s["batch_size"] > 1 for s in bucket["samples"])
    assert main(["gate", "compare", str(tmp_path / "direct.json"), str(tmp_path / "router.json")]) == 0
