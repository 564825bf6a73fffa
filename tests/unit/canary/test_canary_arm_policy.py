"""The canary arm ranks by its own objective and is held to every hard limit of the control: a
candidate policy cannot move a sensitive task class onto a pool the control refuses it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduler.canary.policy import arm_policy, replaced_limits
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import FleetConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.policy import Policy
from scheduler.types import GeoPoint, Request
from tests.canary_fixtures import write_policies
from tests.literals import NOW

HARD_FILTERS = frozenset(type(f).TYPE for f in Scheduler.from_registry(default_scheduler_registry()).filters)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> FleetConfig:
    return load_checked_fleet(policies_dir=write_policies(Path(tmp_path_factory.mktemp("canary")) / "policies"))


def test_the_arm_brings_its_objective_and_nothing_else(fleet: FleetConfig) -> None:
    control, frugal = compile_policy(fleet.policy("steady")), compile_policy(fleet.policy("frugal"))
    arm = arm_policy(control, frugal)
    assert arm.name == "frugal" and arm.scorers == frugal.scorers and arm.fallback == frugal.fallback
    assert arm.max_age.carbon == frugal.max_age.carbon and arm.max_age.region_state == control.max_age.region_state
    assert arm.slo == control.slo and arm.unknown_region_state == control.unknown_region_state
    # The stricter of the two: medical and legal stay sensitive, and no class goes below bf16.
    assert arm.sensitive_task_classes == ("medical", "legal")
    assert arm.precision_floor == {"interactive": "bf16", "batch": "bf16", "deferrable": "bf16"}
    assert arm.canary is None
    assert replaced_limits(control, frugal) == ["sensitive_task_classes", "precision_floor"]


def test_a_sensitive_prompt_stays_off_the_pool_the_control_refuses(fleet: FleetConfig) -> None:
    """On its own, frugal sends a medical prompt to us-east's fp8 pool; as the canary arm it may not."""
    control, frugal = compile_policy(fleet.policy("steady")), compile_policy(fleet.policy("frugal"))
    us_east = tuple(r for r in fleet.regions if r.name == "us-east")
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(3))
    medical = Request("m1", "llama-3.1-70b", 200, 16, task_class="medical")

    def chosen(policy: Policy) -> tuple[str, set[str]]:
        decision = scheduler.schedule(medical, SnapshotBuilder(compile_fleet(us_east), policy).build(NOW))
        return decision.ranked_candidates[0].deployment.precision, {c.deployment.precision for c in decision.survivors}

    assert chosen(frugal) == ("fp8", {"fp8", "bf16"})  # the hazard a canary must not bring in
    assert chosen(control) == ("bf16", {"bf16"})
    assert chosen(arm_policy(control, frugal)) == ("bf16", {"bf16"})


@pytest.mark.parametrize("arm", ["thrifty", "frugal"])
def test_the_arm_never_keeps_a_candidate_a_hard_filter_of_the_control_rejects(fleet: FleetConfig, arm: str) -> None:
    control = compile_policy(fleet.policy("steady"))
    effective = arm_policy(control, compile_policy(fleet.policy(arm)))
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(5))
    on_control = SnapshotBuilder(compile_fleet(fleet.regions), control).build(NOW)
    on_arm = SnapshotBuilder(compile_fleet(fleet.regions), effective).build(NOW)
    rng = random.Random(11)
    models = sorted({c.deployment.name for c in on_control.candidates})
    for i in range(400):
        request = Request(
            f"r{i}", rng.choice(models), rng.choice((50, 2_000, 40_000)), rng.choice((16, 256)),
            workload_class=rng.choice(("interactive", "batch", "deferrable")),
            allowed_jurisdictions=rng.choice((frozenset(), frozenset({"EU"}), frozenset({"US"}))),
            precision=rng.choice((None, None, "bf16", "fp8")),
            task_class=rng.choice((None, "medical", "legal", "chat")),
            client_location=rng.choice((None, GeoPoint(40.7, -74.0), GeoPoint(52.5, 13.4))),
        )
        refused = {r.candidate.index for r in scheduler.schedule(request, on_control).rejected
                   if r.plugin in HARD_FILTERS}
        arm_decision = scheduler.schedule(request, on_arm)
        kept = {c.index for c in arm_decision.survivors}
        arm_refused = {r.candidate.index for r in arm_decision.rejected if r.plugin in HARD_FILTERS}
        assert not kept & refused, (request, sorted(kept & refused))
        assert refused <= arm_refused, request
