"""A policy's ``canary:`` section: validated with the file, every error naming file and field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from scheduler.config.loader import ConfigError
from scheduler.plugins.checked_fleet import load_checked_fleet
from tests.canary_fixtures import CANARY, write_policies


def _issues(tmp_path: Path, canary: dict[str, Any]) -> list[str]:
    policies = write_policies(tmp_path / "policies", canary)
    with pytest.raises(ConfigError) as caught:
        load_checked_fleet(policies_dir=policies)
    return [str(issue) for issue in caught.value.issues]


def _edited(**changes: Any) -> dict[str, Any]:
    canary = copy.deepcopy(CANARY)
    rollback = changes.pop("rollback", None)
    canary.update(changes)
    if rollback is not None:
        canary["rollback"] = rollback
    return canary


def test_a_valid_canary_loads(tmp_path: Path) -> None:
    fleet = load_checked_fleet(policies_dir=write_policies(tmp_path / "policies"))
    canary = fleet.policy("steady").canary
    assert canary is not None and canary.arm == "thrifty" and canary.fraction == 0.5
    assert canary.assign_by == "request_id"
    assert canary.rollback.window == 10.0 and canary.rollback.min_requests == 8
    assert canary.rollback.ttft_slo_attainment is not None and canary.rollback.ttft_slo_attainment.min == 0.8
    assert fleet.policy("thrifty").canary is None


ROLLBACK = CANARY["rollback"]
BAD = [
    (_edited(fraction=1.5), "canary.fraction", "less than or equal to 1"),
    (_edited(fraction=-0.1), "canary.fraction", "greater than or equal to 0"),
    (_edited(fraction="half"), "canary.fraction", "'half'"),
    (_edited(assign_by="user"), "canary.assign_by", "'user'"),
    (_edited(arm="Thrifty!"), "canary.arm", "'Thrifty!'"),
    (_edited(colour="green"), "canary.colour", "unknown key"),
    (_edited(rollback={**ROLLBACK, "window": "soon"}), "canary.rollback.window", "'soon'"),
    (_edited(rollback={**ROLLBACK, "window": "500ms"}), "canary.rollback", "at least 1 s"),
    (_edited(rollback={**ROLLBACK, "min_requests": 0}), "canary.rollback.min_requests", "greater than or equal to 1"),
    (_edited(rollback={"window": "10s", "min_requests": 5}), "canary.rollback", "no rollback bound"),
    (_edited(rollback={**ROLLBACK, "retry_rate": {}}), "canary.rollback", "retry_rate: give at least one bound"),
    (_edited(rollback={**ROLLBACK, "error_rate": {"max": 2}}), "canary.rollback.error_rate.max",
     "less than or equal to 1"),
    (_edited(rollback={**ROLLBACK, "energy_j_per_request": {"max_ratio": 0}}),
     "canary.rollback.energy_j_per_request.max_ratio", "greater than 0"),
    (_edited(rollback={**ROLLBACK, "ttft_slo_attainment": {"floor": 0.9}}),
     "canary.rollback.ttft_slo_attainment.floor", "unknown key"),
]


@pytest.mark.parametrize(("canary", "field", "fragment"), BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_a_bad_canary_names_the_file_and_field(tmp_path: Path, canary: dict[str, Any], field: str,
                                               fragment: str) -> None:
    messages = _issues(tmp_path, canary)
    target = tmp_path / "policies" / "steady.yaml"
    assert any(m.startswith(f"{target}: {field}: ") and fragment in m for m in messages), messages


@pytest.mark.parametrize(("arm", "fragment"), [
    ("frugally", "no policy named 'frugally' (known: frugal, thrifty)"),
    ("steady", "the arm must be another policy, not 'steady' itself"),
])
def test_the_arm_must_be_another_policy(tmp_path: Path, arm: str, fragment: str) -> None:
    messages = _issues(tmp_path, _edited(arm=arm))
    assert messages == [f"{tmp_path / 'policies' / 'steady.yaml'}: canary.arm: {fragment}"]


def test_an_arm_cannot_have_a_canary_of_its_own(tmp_path: Path) -> None:
    policies = write_policies(tmp_path / "policies")
    thrifty = policies / "thrifty.yaml"
    thrifty.write_text(thrifty.read_text() + "canary: {arm: frugal, fraction: 0.1, rollback: {window: 10s, "
                       "min_requests: 5, error_rate: {max: 0.1}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_checked_fleet(policies_dir=policies)
    assert [str(i) for i in caught.value.issues] == [
        f"{policies / 'steady.yaml'}: canary.arm: policy 'thrifty' has a canary of its own; an arm cannot "
        "(its canary would never run)"]
