"""``scheduler gate compare``: each bucket's verdict by the rule (candidate low > baseline high x
(1 + threshold)), quality drops, exit codes, and files that cannot be compared."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.gate import compare

SET = {"name": "standard", "sha256": "a" * 64}


def bucket(mean: float, low: float | None, high: float | None, n: int = 24, sources: dict[str, int] | None = None,
           places: dict[str, int] | None = None) -> dict[str, Any]:
    return {"n": n, "mean_j_per_token": mean, "low_j_per_token": low, "high_j_per_token": high,
            "sources": sources if sources is not None else {"nvml": n},
            "places": places if places is not None else {"eu-north/h200-long": n}}


def measurement(buckets: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format": "carbon-scheduler-gate-measurement/1", "model": "llama-3.1-8b", "request_set": SET,
            "failed": 0, "buckets": buckets, "samples_are_ignored": [], **extra}


def write(path: Path, content: dict[str, Any]) -> Path:
    path.write_text(json.dumps(content))
    return path


BASE = bucket(0.20, 0.18, 0.22)
VERDICTS = [
    ("same figures", bucket(0.20, 0.18, 0.22), "within"),
    ("higher, but the intervals overlap", bucket(0.23, 0.21, 0.25), "within"),
    ("low just under high x 1.05", bucket(0.26, 0.2309, 0.28), "within"),
    ("low just over high x 1.05", bucket(0.26, 0.2311, 0.28), "ROSE"),
    ("clearly lower", bucket(0.10, 0.09, 0.11), "lower"),
    ("no interval (one sample)", bucket(0.30, None, None, n=1), "missing"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "candidate", "verdict"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_energy_verdicts(name: str, candidate: dict[str, Any], verdict: str) -> None:
    base = compare.Measurement.model_validate(measurement({"short-chat": BASE}))
    cand = compare.Measurement.model_validate(measurement({"short-chat": candidate}))
    (row,) = compare.energy_rows(base, cand, 0.05)
    assert row.verdict == verdict and row.failed == (verdict in ("ROSE", "missing"))


@pytest.mark.timeout(30)
def test_missing_new_modelled_and_other_sources() -> None:
    base = compare.Measurement.model_validate(measurement({"short-chat": BASE, "fan-out": BASE}))
    cand = compare.Measurement.model_validate(measurement({
        "short-chat": bucket(0.2, 0.15, 0.25, sources={"nvml": 20, "model": 4}), "long-output": BASE}))
    rows = {r.name: r for r in compare.energy_rows(base, cand, 0.05)}
    assert rows["short-chat"].verdict == "within" and "sources differ: nvml vs model+nvml" in rows["short-chat"].why
    assert rows["fan-out"].verdict == "missing" and rows["long-output"].verdict == "new"
    measured = {r.name: r for r in compare.energy_rows(base, cand, 0.05, require_measured=True)}
    assert measured["short-chat"].verdict == "modelled" and measured["short-chat"].failed


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("baseline", "candidate", "verdict"), [
    (0.800, 0.795, "ok"),        # -0.6 %
    (0.800, 0.790, "DROPPED"),   # -1.25 %
    (0.800, 0.900, "ok"),
    (0.0, -0.1, "DROPPED"),
    (0.0, 0.0, "ok"),
])
def test_quality_verdicts(baseline: float, candidate: float, verdict: str) -> None:
    b = compare.QualityScores(format="carbon-scheduler-quality/1", scores={"gsm8k": baseline})
    c = compare.QualityScores(format="carbon-scheduler-quality/1", scores={"gsm8k": candidate})
    (row,) = compare.quality_rows(b, c, 0.01)
    assert row.verdict == verdict


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), ("0%", 0.0), (" 12.5% ", 0.125)])
def test_parse_fraction(text: str, value: float) -> None:
    assert compare.parse_fraction(text) == pytest.approx(value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text", ["5", "five", "-1%", "%"])
def test_parse_fraction_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        compare.parse_fraction(text)


def quality(path: Path, **scores: float) -> Path:
    return write(path, {"format": "carbon-scheduler-quality/1", "scores": scores})


@pytest.mark.timeout(30)
def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", measurement({"short-chat": BASE, "long-output": BASE}))
    same = write(tmp_path / "same.json", measurement({"short-chat": BASE, "long-output": BASE}))
    rose = write(tmp_path / "rose.json", measurement({"short-chat": BASE, "long-output": bucket(0.6, 0.5, 0.7)}))
    good_q, bad_q = quality(tmp_path / "q1.json", mmlu=0.70, gsm8k=0.80), quality(tmp_path / "q2.json", mmlu=0.70,
                                                                                      gsm8k=0.70)

    assert main(["gate", "compare", str(base), str(same)]) == compare.PASSED
    out = capsys.readouterr().out
    assert "gate PASSED" in out and "ROSE" not in out
    # Every receipt metered: the line a policy's telemetry gate takes, with the file's digest.
    digest = hashlib.sha256(same.read_bytes()).hexdigest()
    assert f"- {{pool: eu-north/h200-long, measurement_sha256: {digest}}}" in out

    assert main(["gate", "compare", str(base), str(rose), "--max-increase", "5%"]) == compare.ENERGY_FAILED
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("long-output")]
    assert "ROSE" in line and "+200.0%" in line
    assert "ROSE" not in next(line for line in out.splitlines() if line.startswith("short-chat"))
    assert "measurement_sha256" not in out

    assert main(["gate", "compare", str(base), str(same), "--quality", str(good_q), str(bad_q),
                 "--max-quality-drop", "1%"]) == compare.QUALITY_FAILED
    assert "DROPPED" in capsys.readouterr().out
    assert main(["gate", "compare", str(base), str(rose), "--quality", str(good_q), str(bad_q)]) == compare.BOTH_FAILED
    assert main(["gate", "compare", str(base), str(same), "--quality", str(good_q), str(good_q)]) == compare.PASSED


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("candidate", "args", "fragment"), [
    ("not json", [], "not JSON"),
    (json.dumps(measurement({}, request_set={"name": "other", "sha256": "b" * 64})), [], "ran other request sets"),
    (json.dumps(measurement({}, model="qwen3-32b")), [], "measured other models"),
    (json.dumps({**measurement({}), "format": "something/2"}), [], "format"),
    (json.dumps(measurement({"short-chat": {"n": "many"}})), [], "buckets.short-chat.n"),
    (json.dumps(measurement({})), ["--max-increase", "5"], "ambiguous"),
])
def test_input_that_cannot_be_compared_exits_2(candidate: str, args: list[str], fragment: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", measurement({"short-chat": BASE}))
    path = tmp_path / "candidate.json"
    path.write_text(candidate)
    assert main(["gate", "compare", str(base), str(path), *args]) == compare.UNUSABLE
    assert fragment in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_a_bad_quality_file_names_its_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", measurement({"short-chat": BASE}))
    bad = write(tmp_path / "q.json", {"format": "carbon-scheduler-quality/1", "scores": {"mmlu": "high"}})
    assert main(["gate", "compare", str(base), str(base), "--quality", str(bad), str(bad)]) == compare.UNUSABLE
    err = capsys.readouterr().err
    assert str(bad) in err and "scores.mmlu" in err
