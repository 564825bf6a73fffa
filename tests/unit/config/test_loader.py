"""Config files: the shipped ones are valid; every error names file, field path and value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS, ConfigError
from scheduler.plugins.checked_fleet import load_checked_fleet as load_fleet


def test_shipped_fleet_is_valid_and_plausible() -> None:
    fleet = load_fleet()
    assert len(fleet.regions) >= 6
    assert {"default", "latency-first", "carbon-first"} <= set(fleet.policies)
    continents = {("US" if r.jurisdiction == "US" else "EU" if r.jurisdiction in {"EU", "UK"} else "AP")
                  for r in fleet.regions}
    assert continents == {"US", "EU", "AP"}
    gpus = {p.gpu for r in fleet.regions for p in r.pools}
    assert {"A100-40GB", "H100-80GB", "H200-141GB"} <= gpus
    total = sum(p.count for r in fleet.regions for p in r.pools)
    # no region holds most of the fleet, and no pool is implausibly large
    assert max(sum(p.count for p in r.pools) for r in fleet.regions) < total / 2
    assert max(p.count for r in fleet.regions for p in r.pools) <= 1024


@pytest.fixture
def config_dirs(tmp_path: Path) -> tuple[Path, Path]:
    regions, policies = tmp_path / "regions", tmp_path / "policies"
    shutil.copytree(EMBEDDED_REGIONS, regions)
    shutil.copytree(EMBEDDED_POLICIES, policies)
    return regions, policies


BAD_REGION_EDITS = [
    ("pue: 1.1", "pue: high", "pue", "'high'"),
    ("count: 64", "count: '64'", "pools[0].count", "'64'"),
    ("gpu: H200-141GB", "gpu: H300", "pools[0].gpu", "'H300' is not a known GPU"),
    ("jurisdiction: EU", "jurisdiction: eu", "jurisdiction", "'eu'"),
    ("pue: 1.1", "pue: 1.1\ncolour: green", "colour", "unknown key"),
    ("  poll_interval_s: 5m", "  poll_interval_s: soon", "carbon.poll_interval_s", "'soon'"),
    ('grid_zone: "NO"', "grid_zone: NO", "grid_zone", "False"),
]


@pytest.mark.parametrize(("old", "new", "path", "fragment"), BAD_REGION_EDITS, ids=[e[1] for e in BAD_REGION_EDITS])
def test_region_error_names_file_field_and_value(config_dirs, old, new, path, fragment) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    target = regions / "eu-north.yaml"
    text = target.read_text()
    assert old in text
    target.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        load_fleet(regions, policies)
    messages = [str(issue) for issue in caught.value.issues]
    assert any(m.startswith(f"{target}: {path}: ") and fragment in m for m in messages), messages


def test_policy_errors_are_reported_with_region_errors(config_dirs) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    (policies / "default.yaml").write_text((policies / "default.yaml").read_text().replace("carbon: 2h", "carbon: soon"))
    (regions / "us-west.yaml").write_text((regions / "us-west.yaml").read_text().replace("pue: 1.12", "pue: 9"))
    with pytest.raises(ConfigError) as caught:
        load_fleet(regions, policies)
    text = str(caught.value)
    assert "default.yaml: max_age.carbon: expected a duration like '90m' or '2h', got 'soon'" in text
    assert "us-west.yaml: pue:" in text and "9" in text


BAD_POLICY_EDITS = [
    ("{type: carbon-scorer, rate: 3000 USD/tCO2e}", "{type: karbon-scorer, rate: 1000 USD/tCO2e}",
     "scorers[0].type", "'karbon-scorer' is not a registered scorer (known: energy-scorer, carbon-scorer"),
    ("{type: carbon-scorer, rate: 3000 USD/tCO2e}", "{type: carbon-scorer, rate: 1000 USD/h}",
     "scorers[0].rate", "carbon-scorer reports gCO2e: a rate per h (time) cannot price a quantity in gCO2e (mass of CO2e); "
     "expected a rate like '200 USD/tCO2e'"),
    ("{type: carbon-scorer, rate: 3000 USD/tCO2e}", "{type: carbon-scorer, rate: 1000 EUR/tCO2e}",
     "scorers[0].rate", "expected a rate like '200 USD/tCO2e' or '0.5 USD/h', got '1000 EUR/tCO2e'"),
    ("{type: carbon-scorer, rate: 3000 USD/tCO2e}", "{type: carbon-scorer, rate: '1000 USD/tons'}",
     "scorers[0].rate", "unknown unit 'tons'"),
    ("rate: {interactive: 0.02 USD/h, batch: 0.01 USD/h, deferrable: 0}\n",
     "rate: {interactive: 0.02 USD/h, batch: 0.01 USD/h}\n",
     "scorers[2].rate", "deferrable: no rate given"),
    ("parameters: {ttft_log_sigma: 0.25, queue_cv: 1.0}", "parameters: {ttft_log_sigma: -1, queue_cv: 1.0}",
     "scorers[3].parameters.ttft_log_sigma", "greater than 0"),
    ("rate: {interactive: 0.0003 USD/miss,", "rate: {interactive: 0.0003 USD/ms,",
     "scorers[3].rate", "slo-risk-scorer reports miss: a rate per ms (time) cannot price a quantity in miss"),
    ("parameters: {threshold_tokens: 32768, min_hbm_gb: 141}", "parameters: {threshold_tokens: '32768', min_hbm_gb: 141}",
     "matchers[0].parameters.threshold_tokens", "'32768'"),
    ("parameters: {threshold_tokens: 32768, min_hbm_gb: 141}", "parameters: {threshold: 32768}",
     "matchers[0].parameters.threshold", "long-context-matcher has no parameter by this name"),
    ("    - {type: ttft-scorer, rate: 1 USD/h}\n# A region", "    - {type: carbon-scorer, rate: 1000 USD/tCO2e}\n# A region",
     "fallback.scorers[0].type", "'carbon-scorer' is an energy-layer scorer; the fallback objective ranks without"),
    ("  - {type: price-scorer, rate: 1}    ", "  - {type: ttft-scorer, rate: 1 USD/h}",
     "scorers[2].type", "'ttft-scorer' is listed twice in scorers"),
]


@pytest.mark.parametrize(("old", "new", "path", "fragment"), BAD_POLICY_EDITS,
                         ids=[e[2] + ":" + e[3][:30] for e in BAD_POLICY_EDITS])
def test_policy_plugin_errors_name_file_field_and_value(config_dirs, old, new, path, fragment) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    target = policies / "default.yaml"
    text = target.read_text()
    old, new = old.replace("\\n", "\n"), new.replace("\\n", "\n")
    assert old in text, old
    target.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        load_fleet(regions, policies)
    messages = [str(issue) for issue in caught.value.issues]
    assert any(m.startswith(f"{target}: {path}: ") and fragment in m for m in messages), messages


def test_duplicate_region_names(config_dirs) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    shutil.copy(regions / "eu-north.yaml", regions / "eu-north-copy.yaml")
    with pytest.raises(ConfigError, match="region 'eu-north' is also defined in"):
        load_fleet(regions, policies)


def test_yaml_syntax_error_names_the_line(config_dirs) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    (regions / "broken.yaml").write_text("name: x\npools: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: line \d+, column \d+: invalid YAML"):
        load_fleet(regions, policies)


def test_cli_validate_exit_codes(config_dirs, capsys) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    assert main(["config", "validate", "--regions", str(regions), "--policies", str(policies)]) == 0
    assert "ok: 8 regions" in capsys.readouterr().out
    target = regions / "us-east.yaml"
    target.write_text(target.read_text().replace("count: 512", "count: lots"))
    assert main(["config", "validate", "--regions", str(regions), "--policies", str(policies)]) == exit_codes.CONFIG
    err = capsys.readouterr().err
    assert f"{target}: pools[1].count: " in err and "'lots'" in err


def _scale_to_zero(regions: Path, model: str) -> list[str]:
    """Give ``model`` an autoscaling block with min_replicas 0 in every region file; the regions
    ("name/") it is served in."""
    served = []
    for path in sorted(regions.glob("*.yaml")):
        text = path.read_text()
        line = next((line for line in text.splitlines() if f"name: {model}," in line), None)
        if line is None:
            continue
        served.append(f"{path.stem}/")
        path.write_text(text.replace(line, line.replace(
            "tensor_parallel: 1}", "tensor_parallel: 1, autoscaling: {min_replicas: 0, max_replicas: 2}}")))
    return served


def test_a_model_every_pool_may_scale_to_zero_is_a_warning_naming_its_pools(config_dirs, capsys) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    assert load_fleet(regions, policies).warnings == ()
    served = _scale_to_zero(regions, "llama-3.2-3b")
    assert len(served) == 5
    warnings = load_fleet(regions, policies).warnings
    assert len(warnings) == 1 and "model llama-3.2-3b: every pool serving it may scale it to zero" in warnings[0]
    assert all(region in warnings[0] for region in served)
    assert main(["config", "validate", "--regions", str(regions), "--policies", str(policies)]) == 0
    assert "warning: " in capsys.readouterr().err
    assert main(["config", "validate", "--regions", str(regions), "--policies", str(policies), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == list(warnings)


def test_one_pool_kept_warm_is_no_warning(config_dirs) -> None:  # type: ignore[no-untyped-def]
    regions, policies = config_dirs
    _scale_to_zero(regions, "llama-3.2-3b")
    # us-south's block back to the default's one warm replica
    target = regions / "us-south.yaml"
    target.write_text(target.read_text().replace("autoscaling: {min_replicas: 0, max_replicas: 2}",
                                                 "autoscaling: {min_replicas: 1, max_replicas: 2}"))
    assert load_fleet(regions, policies).warnings == ()


def test_cli_schema_is_json_schema(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["region"]["additionalProperties"] is False
    assert "pools" in schema["region"]["properties"] and "scorers" in schema["policy"]["properties"]
    assert schema["plugins"]["scorers"]["carbon-scorer"]["unit"] == "gCO2e"
    assert "threshold_tokens" in schema["plugins"]["matchers"]["long-context-matcher"]["parameters"]["properties"]
