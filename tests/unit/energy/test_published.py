"""The published points, and the energy model against those it was NOT fitted to."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from scheduler.energy import cli
from scheduler.energy.derive import FITTED_GENERATION, fit_published, load_fit
from scheduler.energy.published import POINTS_FILE, PublishedError, load_points
from scheduler.energy.validate import REQUIRED_COVERAGE, as_text, coverage, rows


def test_points_are_cited_and_split() -> None:
    data = load_points()
    roles = {r: len(data.role(r)) for r in ("fit", "held_out", "excluded")}
    print(f"\n{roles}")
    assert roles["fit"] >= 30 and roles["held_out"] >= 30
    assert all(p.url.startswith("https://github.com/ml-energy/leaderboard/blob/") for p in data.points)
    assert all(p.note for p in data.role("excluded"))
    # The figure the previous model was scaled to is a check now, not a fit point.
    anchor = next(p for p in data.points if p.id == "mle3-llama-3.1-8b-lm-arena-chat-h100x1-b64")
    assert anchor.role == "held_out" and anchor.j_per_token == pytest.approx(0.1186, abs=1e-4)


def test_every_held_out_group_is_covered_by_the_model_intervals() -> None:
    """The model against the published points it was not fitted to: in each interval class
    (GPUs measured by the fit; GPUs reached by transfer) at least 90 % of the held-out
    points fall within the interval the model states for that pool."""
    table = rows()
    print("\n" + as_text(table))
    checks = coverage(table)
    assert {c.interval for c in checks} == {"measured", "transfer"}
    for c in checks:
        assert c.share >= REQUIRED_COVERAGE, f"{c.interval}: {c.within}/{c.points} within the interval"
    measured = [r for r in table if r.interval == "measured"]
    assert all(r.within for r in measured)


def test_the_check_can_fail() -> None:
    """With the intervals a tenth as wide the same comparison fails: it tests something."""
    fit = load_fit()
    narrow = dataclasses.replace(fit, rel_error_measured=fit.rel_error_measured / 10,
                                 rel_error_transfer=fit.rel_error_transfer / 10)
    assert not all(c.passed for c in coverage(rows(fitted=narrow)))


def test_the_fit_never_reads_held_out_points(tmp_path: Path) -> None:
    """Changing every held-out figure leaves the fitted parameters and intervals unchanged."""
    doc = yaml.safe_load(POINTS_FILE.read_text())
    for point in doc["points"]:
        if point["role"] != "fit":
            point["j_per_token"] *= 3.0
            point["tokens_per_s"] *= 0.2
    changed = tmp_path / "points.yaml"
    changed.write_text(yaml.safe_dump(doc))
    before, after = fit_published(), fit_published(load_points(changed))
    assert after.assumptions == before.assumptions
    assert (after.rel_error_measured, after.rel_error_transfer) == (before.rel_error_measured,
                                                                   before.rel_error_transfer)
    assert all(p.gpu.generation == FITTED_GENERATION for p in load_points().role("fit")
               if p.id in before.fit_errors)


def test_loader_error_names_file_field_and_value(tmp_path: Path) -> None:
    doc = yaml.safe_load(POINTS_FILE.read_text())
    doc["points"][0]["gpu"] = "H300"
    doc["points"][1]["j_per_token"] = -0.1
    doc["points"][2]["role"] = "excluded"
    bad = tmp_path / "points.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PublishedError) as caught:
        load_points(bad)
    text = str(caught.value)
    print("\n" + text)
    assert f"{bad}: points.1.j_per_token:" in text and "-0.1" in text
    doc["points"][1]["j_per_token"] = 0.1
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PublishedError) as caught:
        load_points(bad)
    text = str(caught.value)
    assert "points.0.gpu: 'H300' is not known" in text
    assert "points.2.note: an excluded point needs a note" in text


def test_validate_cli_prints_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="scheduler")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["energy", "validate", "--all"])
    assert args.handler(args) == 0
    text = capsys.readouterr().out
    assert "mle3-qwen3-14b-gpqa-h100x1-b64" in text and "(excluded)" in text and "pass" in text
    args = parser.parse_args(["energy", "validate", "--json"])
    assert args.handler(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and out["points"] and all(p["role"] == "held_out" for p in out["points"])
