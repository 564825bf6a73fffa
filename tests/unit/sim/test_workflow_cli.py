"""``scheduler simulate --workflow SHAPE:N:TOKENS`` end to end on the shipped fleet, a few
simulated minutes long."""

from __future__ import annotations

import json

import pytest

from scheduler.cli import main


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("value", "why"), [
    ("fanout:0:4096", "N >= 1"), ("star:8:1", "SHAPE must be one of chain, fanout, dag"), ("fanout:8", "three parts"),
])
def test_a_bad_workflow_is_refused_naming_the_value(value: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--workflow", value, "--no-progress"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--workflow" in err and repr(value) in err and why in err


@pytest.mark.timeout(20)
def test_simulate_workflow_prints_both_figures_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--workflow", "fanout:8:4096", "--hours", "0.005", "--rate", "1", "--json",
                 "--no-progress"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["workflow"]["shape"] == "fanout"
    assert out["scenario"]["workflow"]["steps"] == 8 and out["scenario"]["workflow"]["prefix_tokens"] == 4096
    assert [p["policy"] for p in out["policies"]] == ["default", "latency-first", "carbon-first"]
    for p in out["policies"]:
        assert p["requests"] == p["ran"] == 8 * p["workflows"] == 8 * 18
        assert p["j_per_output_token_affinity"] == p["j_per_output_token"] > 0
        assert p["j_per_output_token_no_affinity"] > 0
        assert p["j_per_output_token_ratio"] == pytest.approx(
            p["j_per_output_token_no_affinity"] / p["j_per_output_token_affinity"])
        for key in ("prefix_hit_share", "workflows_in_one_pool_share", "ttft_p99_ms", "workflow_latency_p50_s"):
            assert f"{key}_affinity" in p and f"{key}_no_affinity" in p, key


@pytest.mark.timeout(20)
def test_simulate_workflow_table_has_a_workflows_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--workflow", "chain:3:1024", "--hours", "0.005", "--rate", "1", "--compare",
                 "default", "--no-progress"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("workflows"))
    assert "J/out tok" in lines[header] and lines[header + 2].startswith("default")
