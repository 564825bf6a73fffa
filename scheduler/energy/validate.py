"""The energy model against the published points it was not fitted to (``scheduler energy validate``).

For each ``held_out`` point of ``published/points.yaml`` (and, shown apart, each ``excluded``
one): the model's J per output token (``published.predicted_j_per_token`` of the fitted
parameters carried to the point's model, GPU and TP) against the published figure,

    error = model / published - 1

and the interval the model gives that pool: ``rel_error_measured`` on a GPU measured by the
fit, ``rel_error_transfer`` on any other (``derive``). The check passes when, in each of the
two interval classes, at least ``REQUIRED_COVERAGE`` of the held-out points fall within their
interval (the intervals are the largest of n out-of-fit residuals, which a new point exceeds
with probability about 1 / (n + 1); 90 % leaves room for that and no more).

The same held-out errors bound how far the model's *ratio* of two predictions on one GPU can
be off (``ratio_error``: what the split of a measured interval among requests rests on,
``scheduler.energy.attribution``): (1 + e_a) / (1 + e_b) - 1 ~ e_a - e_b, so

    ratio_error(class) = max e - min e   over the held-out points of the GPU's interval class

(0.271 measured, 0.652 transfer with the shipped fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from scheduler.energy.derive import FittedParameters, load_fit
from scheduler.energy.fit import point_costs
from scheduler.energy.hardware import GpuSpec
from scheduler.energy.published import Point, Published, load_points, predicted_j_per_token

REQUIRED_COVERAGE = 0.9


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    role: str
    model: str
    gpu: str
    tensor_parallel: int
    task: str
    batch: float
    output_tokens: float
    published_j_per_token: float
    model_j_per_token: float
    error: float
    rel_error: float
    interval: str
    url: str

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.rel_error


@dataclass(frozen=True, slots=True)
class Coverage:
    interval: str
    points: int
    within: int

    @property
    def share(self) -> float:
        return self.within / self.points if self.points else 1.0

    @property
    def passed(self) -> bool:
        return self.share >= REQUIRED_COVERAGE


def rows(published: Published | None = None, fitted: FittedParameters | None = None,
         roles: Sequence[str] = ("held_out",)) -> list[Row]:
    data = published or load_points()
    fit = fitted or load_fit()
    return [_row(p, fit) for p in data.points if p.role in roles]


def coverage(table: Sequence[Row]) -> list[Coverage]:
    held = [r for r in table if r.role == "held_out"]
    return [
        Coverage(kind, len(group), sum(r.within for r in group))
        for kind in ("measured", "transfer")
        if (group := [r for r in held if r.interval == kind])
    ]


def ratio_error(gpu: GpuSpec, table: Sequence[Row] | None = None, fitted: FittedParameters | None = None) -> float:
    """Bound on one prediction's relative error against another's on ``gpu`` (module doc)."""
    fit = fitted or load_fit()
    kind = "measured" if gpu.name in fit.measured_gpus else "transfer"
    errors = [r.error for r in (table if table is not None else rows(fitted=fit))
              if r.role == "held_out" and r.interval == kind]
    return max(errors) - min(errors)


def as_json(table: Sequence[Row]) -> dict[str, object]:
    checks = coverage(table)
    return {
        "required_coverage": REQUIRED_COVERAGE,
        "passed": all(c.passed for c in checks),
        "coverage": [asdict(c) | {"share": c.share, "passed": c.passed} for c in checks],
        "points": [asdict(r) | {"within": r.within} for r in table],
    }


def as_text(table: Sequence[Row]) -> str:
    header = (f"{'point':58} {'gpu':10} {'tp':>2} {'batch':>7} {'out':>6} {'published':>9} {'model':>8} "
              f"{'error':>7} {'interval':>8}  ")
    lines = [header + "in?", "-" * (len(header) + 3)]
    for r in table:
        mark = "yes" if r.within else "NO"
        if r.role != "held_out":
            mark += f" ({r.role})"
        lines.append(
            f"{r.id:58} {r.gpu:10} {r.tensor_parallel:>2} {r.batch:>7.1f} {r.output_tokens:>6.0f} "
            f"{r.published_j_per_token:>9.4f} {r.model_j_per_token:>8.4f} {r.error:>+7.1%} "
            f"{'±' + format(r.rel_error, '.0%'):>8}  {mark}"
        )
    for c in coverage(table):
        lines.append(f"{c.interval} GPUs: {c.within}/{c.points} held-out points within the interval "
                     f"({c.share:.0%}; required {REQUIRED_COVERAGE:.0%}): {'pass' if c.passed else 'FAIL'}")
    return "\n".join(lines)


def _row(point: Point, fit: FittedParameters) -> Row:
    model_j = predicted_j_per_token(point_costs(point, fit.assumptions), point)
    measured = point.gpu.name in fit.measured_gpus
    return Row(
        id=point.id,
        role=point.role,
        model=point.model.name,
        gpu=point.gpu.name,
        tensor_parallel=point.tensor_parallel,
        task=point.task,
        batch=point.batch,
        output_tokens=point.output_tokens,
        published_j_per_token=point.j_per_token,
        model_j_per_token=model_j,
        error=model_j / point.j_per_token - 1.0,
        rel_error=fit.rel_error(point.gpu),
        interval="measured" if measured else "transfer",
        url=point.url,
    )
