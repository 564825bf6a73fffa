"""``scheduler gate compare``: does a candidate spend more energy per token than the baseline,
beyond what the two measurements can tell apart, or answer worse? (docs/gate.md)

Energy, per bucket, baseline B and candidate C (``scheduler.gate.stats``: mean J/token and
its interval [low, high]), threshold t (``--max-increase``):

    rose      C.low > B.high x (1 + t)    above the threshold even at the ends of both
                                          intervals most favourable to the candidate: FAIL
    lower     C.high < B.low              clearly lower
    within    otherwise                   not told apart from the baseline within t
    missing   B has the bucket, C has no interval for it (not run, or under 2 samples): FAIL
    modelled  with --require-measured, C's bucket has receipts whose energy was only
              modelled ("model"): FAIL
    new       only C has the bucket: no verdict

Quality (``--quality B.json C.json``, threshold q ``--max-quality-drop``), per score s of B
(higher is better):

    dropped   (B[s] - C[s]) / |B[s]| > q      (B[s] = 0: C[s] < 0): FAIL
    missing   C has no score s: FAIL

The quality file: ``{"format": "carbon-scheduler-quality/1", "label": "...", "scores":
{"name": number, ...}}``.

Exit codes: 0 passed; 1 energy failed; 3 quality failed; 4 both failed; 2 the input cannot be
compared (unreadable or malformed file, other request sets or models).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from scheduler.config.loader import ConfigError, ConfigIssue, validate

QUALITY_FORMAT = "carbon-scheduler-quality/1"
PASSED, ENERGY_FAILED, UNUSABLE, QUALITY_FAILED, BOTH_FAILED = 0, 1, 2, 3, 4
FAILING = frozenset({"ROSE", "missing", "modelled", "DROPPED"})


class _Record(BaseModel):
    # A measurement file holds more than compare reads (samples, timings): the rest is not read.
    model_config = ConfigDict(extra="ignore", frozen=True)


class BucketRecord(_Record):
    n: int = Field(ge=0)
    mean_j_per_token: float | None
    low_j_per_token: float | None
    high_j_per_token: float | None
    sources: dict[str, int] = Field(default_factory=dict)
    places: dict[str, int] = Field(default_factory=dict)


class SetRef(_Record):
    name: str
    sha256: str


class Measurement(_Record):
    format: Literal["carbon-scheduler-gate-measurement/1"]  # scheduler.gate.measure.FORMAT
    label: str = ""
    model: str
    request_set: SetRef
    failed: int = Field(default=0, ge=0)
    buckets: dict[str, BucketRecord]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"a score must be a finite number, got {value!r}")
    return value


class QualityScores(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["carbon-scheduler-quality/1"]
    label: str = ""
    scores: dict[str, Annotated[float, AfterValidator(_finite)]] = Field(min_length=1)


def read_json(path: Path) -> tuple[dict[str, Any], str]:
    """The file's JSON object and its sha256; ``ConfigError`` naming the file otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([ConfigIssue(str(path), "", f"cannot read: {exc.strerror}")]) from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue(str(path), "", f"not JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(str(path), "", f"expected a JSON object, got {type(data).__name__}")])
    return data, hashlib.sha256(raw).hexdigest()


def load_measurement(path: Path) -> tuple[Measurement, str]:
    data, digest = read_json(path)
    return validate(Measurement, data, str(path)), digest


def load_quality(path: Path) -> QualityScores:
    return validate(QualityScores, read_json(path)[0], str(path))


def parse_fraction(text: str) -> float:
    """'5%' or '0.05' -> 0.05 (a bare number of 1 or more is refused: '5' is ambiguous)."""
    value = text.strip()
    try:
        fraction = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ValueError(f"expected a share like '5%' or '0.05', got {text!r}") from None
    if not value.endswith("%") and fraction >= 1:
        raise ValueError(f"{text!r} is ambiguous: write '{text}%' or a fraction below 1")
    if not 0 <= fraction < 10:
        raise ValueError(f"expected a share between 0% and 1000%, got {text!r}")
    return fraction


@dataclass(frozen=True)
class Row:
    name: str
    baseline: str
    candidate: str
    change: str
    verdict: str
    why: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


def _interval(bucket: BucketRecord | None) -> str:
    if bucket is None or bucket.mean_j_per_token is None:
        return "-"
    if bucket.low_j_per_token is None or bucket.high_j_per_token is None:
        return f"{bucket.mean_j_per_token:.4g} [n={bucket.n}]"
    return f"{bucket.mean_j_per_token:.4g} [{bucket.low_j_per_token:.4g}, {bucket.high_j_per_token:.4g}]"


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return "-"
    return f"{(after / before - 1) * 100:+.1f}%"


def energy_rows(baseline: Measurement, candidate: Measurement, max_increase: float,
                require_measured: bool = False) -> list[Row]:
    rows = []
    for name, b in baseline.buckets.items():
        c = candidate.buckets.get(name)
        cells = (name, _interval(b), _interval(c), _change(b.mean_j_per_token, c.mean_j_per_token if c else None))
        rows.append(Row(*cells, *_energy_verdict(b, c, max_increase, require_measured)))
    for name, c in candidate.buckets.items():
        if name not in baseline.buckets:
            rows.append(Row(name, "-", _interval(c), "-", "new"))
    return rows


def _energy_verdict(b: BucketRecord, c: BucketRecord | None, max_increase: float,
                    require_measured: bool) -> tuple[str, str]:
    """(verdict, why) of one bucket (module doc)."""
    if c is None or c.low_j_per_token is None or c.high_j_per_token is None:
        return "missing", "the candidate has no interval for it (not run, or under 2 samples)"
    if b.low_j_per_token is None or b.high_j_per_token is None:
        return "missing", "the baseline has no interval for it (under 2 samples)"
    if require_measured and "model" in c.sources:
        return "modelled", f"{c.sources['model']} of {c.n} receipts only modelled"
    notes = []
    if c.low_j_per_token > b.high_j_per_token * (1 + max_increase):
        verdict = "ROSE"
        notes.append(f"low {c.low_j_per_token:.4g} > high {b.high_j_per_token:.4g} x {1 + max_increase:.4g}")
    else:
        verdict = "lower" if c.high_j_per_token < b.low_j_per_token else "within"
    if set(b.sources) != set(c.sources):
        # A meter's figure and a model's are not the same measurement.
        notes.append(f"sources differ: {'+'.join(sorted(b.sources))} vs {'+'.join(sorted(c.sources))}")
    return verdict, "; ".join(notes)


def quality_rows(baseline: QualityScores, candidate: QualityScores, max_drop: float) -> list[Row]:
    rows = []
    for name, b in baseline.scores.items():
        c = candidate.scores.get(name)
        if c is None:
            rows.append(Row(name, f"{b:.4g}", "-", "-", "missing", "the candidate has no such score"))
            continue
        drop = (b - c) / abs(b) if b != 0 else (math.inf if c < 0 else 0.0)
        change = f"{(c / b - 1) * 100:+.2f}%" if b != 0 else f"{c - b:+.4g}"
        if drop > max_drop:
            rows.append(Row(name, f"{b:.4g}", f"{c:.4g}", change, "DROPPED", f"more than {max_drop:.2%} below"))
        else:
            rows.append(Row(name, f"{b:.4g}", f"{c:.4g}", change, "ok"))
    return rows


def render(title: str, rows: list[Row]) -> str:
    header = Row(title, "baseline", "candidate", "change", "verdict")
    table = [header, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("name", "baseline", "candidate", "change")]
    lines = []
    for r in table:
        cells = (r.name, r.baseline, r.candidate, r.change)
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + "  " + r.verdict
        lines.append(line + (f"  ({r.why})" if r.why else ""))
    return "\n".join(lines)


def exit_code(energy: list[Row], quality: list[Row]) -> int:
    energy_failed, quality_failed = any(r.failed for r in energy), any(r.failed for r in quality)
    if energy_failed and quality_failed:
        return BOTH_FAILED
    return ENERGY_FAILED if energy_failed else QUALITY_FAILED if quality_failed else PASSED


def comparable(baseline: Measurement, candidate: Measurement, paths: tuple[Path, Path]) -> list[str]:
    """Why the two cannot be compared (empty: they can)."""
    problems = []
    if baseline.request_set.sha256 != candidate.request_set.sha256:
        problems.append(f"{paths[0]} and {paths[1]} ran other request sets ({baseline.request_set.name} "
                        f"{baseline.request_set.sha256[:12]} vs {candidate.request_set.name} "
                        f"{candidate.request_set.sha256[:12]}): measure both with the same set")
    if baseline.model != candidate.model:
        problems.append(f"{paths[0]} and {paths[1]} measured other models ({baseline.model} vs {candidate.model})")
    return problems


def measured_places(candidate: Measurement) -> list[str] | None:
    """The pools the candidate measured when every receipt of it was metered, else None."""
    if any("model" in b.sources or not b.sources for b in candidate.buckets.values()):
        return None
    return sorted({place for b in candidate.buckets.values() for place in b.places})

