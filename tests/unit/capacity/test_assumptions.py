"""The planning assumptions file: the shipped one loads; a bad one is refused with the file,
the field and the value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from scheduler import exit_codes
from scheduler.capacity.assumptions import SHIPPED_ASSUMPTIONS, load_assumptions
from scheduler.cli import main
from scheduler.config.loader import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_assumptions_load() -> None:
    a = load_assumptions()
    assert a.slices == 24
    assert a.slice_s == 3600.0
    assert dict(a.class_shares) == {"interactive": 1.0, "batch": 0.0, "deferrable": 0.0}
    assert a.cold_start_s == 120.0


def edited(path: Path, section: str | None, key: str, value: object) -> Path:
    raw = yaml.safe_load(SHIPPED_ASSUMPTIONS.read_text(encoding="utf-8"))
    (raw if section is None else raw[section])[key] = value
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("section", "key", "value", "field", "says"), [
    ("demand", "warm_quantile", 1.5, "demand.warm_quantile", "1.5"),
    ("demand", "classes", {"interactive": 0.5, "batch": 0.2}, "demand", "must add up to 1, got 0.7"),
    ("demand", "classes", {"interactive": 1.0, "chat": 0.0}, "demand", "unknown workload class(es) ['chat']"),
    ("demand", "hourly_profile", [1.0] * 23, "demand.hourly_profile", "at least 24"),
    ("demand", "burst_window", "soon", "demand.burst_window", "'soon'"),
    ("serving", "target_utilisation", 1.2, "serving.target_utilisation", "1.2"),
    ("serving", "min_replicas_per_pool", "2", "serving.min_replicas_per_pool", "'2'"),
    ("cold_start", "power_share_of_tdp", -0.1, "cold_start.power_share_of_tdp", "-0.1"),
    (None, "slice", "7h", "slice", "a slice must divide a day into whole slices, got 25200 s"),
    (None, "model", "gpt-9", "model", "'gpt-9' is not a known model"),
    (None, "surprise", 1, "surprise", "unknown key"),
    ("carbon", "replan_every", "90m", "(top level)", "carbon.replan_every (5400 s) must be a whole number of slices"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_value_is_refused_naming_file_field_and_value(tmp_path: Path, section: str | None, key: str,
                                                              value: object, field: str, says: str) -> None:
    path = edited(tmp_path / "assumptions.yaml", section, key, value)
    with pytest.raises(ConfigError) as caught:
        load_assumptions(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}: "), message
    assert says in message, message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_assumptions(tmp_path / "missing.yaml")


@pytest.mark.timeout(60)
def test_the_command_refuses_bad_assumptions_with_the_config_exit_code(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = edited(tmp_path / "assumptions.yaml", "demand", "max_headroom", 0.5)
    assert main(["plan", "--assumptions", str(path)]) == exit_codes.CONFIG
    assert f"{path}: demand.max_headroom: Input should be greater than or equal to 1, got 0.5" in capsys.readouterr().err


def test_the_diurnal_example_differs_from_the_shipped_assumptions_only_in_its_hourly_profile() -> None:
    example = load_assumptions(ROOT / "examples" / "planning" / "diurnal.yaml")
    shipped = load_assumptions()
    assert sum(example.hourly_profile) / 24 == pytest.approx(1.0)
    assert dataclasses.replace(example, source=shipped.source, hourly_profile=shipped.hourly_profile) == shipped
