"""Published measurements (``published/points.yaml``) and how the step model predicts them.

A published point is a steady state: a replica serves a stream of requests with ``batch``
sequences running on average, each request of I prompt tokens (the task's assumed input
length) and O output tokens (mean ``output_tokens``, E[O^2] = ``output_spread`` x E[O]^2), and
the benchmark divides the GPU energy of that window by the output tokens generated. The model
predicts it with the router's own predictor (``step.predict``) at that batch, every other
sequence at the mean context c = I + spread x O / 2 (a running sequence of a request with O
outputs is, on average over its steps, O / 2 into its output; long requests hold their slot
longer, hence the second moment):

    J/token  = [prefill_joules(I) + O step_j + step_j_per_context_token (O I + spread O^2 / 2)] / O
             (the predictor's energy of one request, averaged over the output-length distribution)
    tokens/s = B / tau,  tau = t_step + B (t_token + c (t_kv + t_pair))
                              + (B / O) (I t_token + I^2/2 (t_pair + t_kv / M'))
             (one step decodes B tokens and, in the steady state, prefills the B / O requests that
              replace the finished ones; M' the prefill budget of ``step.prefill_budget``)

Loading is strict: an error names the file, the field path and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scheduler.energy.hardware import GPU_CATALOGUE, GpuSpec
from scheduler.energy.model_catalogue import MODEL_CATALOGUE, PRECISION_BYTES, ModelSpec
from scheduler.energy.step import RatedCosts, StepCosts, predict, prefill_budget

POINTS_FILE = Path(__file__).parent / "published" / "points.yaml"
Role = Literal["fit", "held_out", "excluded"]


class PublishedError(ValueError):
    """The points file is invalid; ``issues`` lists 'file: field: problem'."""

    def __init__(self, issues: list[str]) -> None:
        super().__init__("\n".join(issues))
        self.issues = issues


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceDoc(_Strict):
    title: str = Field(min_length=1)
    url: str = Field(pattern=r"^https://")
    used_for: str = Field(min_length=1)


class ModelDoc(_Strict):
    params_b: float = Field(gt=0)
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    config: str = Field(pattern=r"^https://")


class TaskDoc(_Strict):
    input_tokens: int = Field(ge=1)
    basis: str = Field(min_length=1)


class PointDoc(_Strict):
    id: str = Field(min_length=1)
    source: str
    file: str = Field(min_length=1)
    model: str
    gpu: str
    tensor_parallel: int = Field(ge=1)
    precision: str
    task: str
    max_num_seqs: int = Field(ge=1)
    batch: float = Field(ge=1)
    output_tokens: float = Field(gt=0)
    output_spread: float = Field(ge=1)
    j_per_token: float = Field(gt=0)
    tokens_per_s: float = Field(gt=0)
    power_w: float = Field(gt=0)
    role: Role
    # Why an excluded point is excluded: a key of the file's notes.
    note: str = ""


class PointsFile(_Strict):
    sources: dict[str, SourceDoc] = Field(min_length=1)
    models: dict[str, ModelDoc]
    notes: dict[str, str] = Field(default_factory=dict)
    tasks: dict[str, TaskDoc] = Field(min_length=1)
    points: list[PointDoc] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> PointsFile:
        problems = []
        seen: set[str] = set()
        for i, p in enumerate(self.points):
            checks = (
                ("source", p.source, self.sources),
                ("model", p.model, {**MODEL_CATALOGUE, **self.models}),
                ("gpu", p.gpu, GPU_CATALOGUE),
                ("precision", p.precision, PRECISION_BYTES),
                ("task", p.task, self.tasks),
            )
            for name, value, known in checks:
                if value not in known:
                    problems.append(f"points.{i}.{name}: {value!r} is not known (known: {', '.join(known)})")
            if p.role == "excluded" and p.note not in self.notes:
                problems.append(f"points.{i}.note: an excluded point needs a note from notes, got {p.note!r}")
            if p.id in seen:
                problems.append(f"points.{i}.id: {p.id!r} appears twice")
            seen.add(p.id)
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass(frozen=True, slots=True)
class Source:
    key: str
    title: str
    url: str
    used_for: str


@dataclass(frozen=True, slots=True)
class Point:
    id: str
    source: Source
    url: str
    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel: int
    precision: str
    task: str
    input_tokens: int
    max_num_seqs: int
    batch: float
    output_tokens: float
    output_spread: float
    j_per_token: float
    tokens_per_s: float
    role: Role
    note: str

    @property
    def context(self) -> float:
        """Mean context of a running sequence: I + spread x O / 2 (module doc)."""
        return self.input_tokens + self.output_spread * self.output_tokens * 0.5


@dataclass(frozen=True)
class Published:
    sources: Mapping[str, Source]
    tasks: Mapping[str, TaskDoc]
    notes: Mapping[str, str]
    points: tuple[Point, ...]
    path: str

    def role(self, role: Role) -> tuple[Point, ...]:
        return tuple(p for p in self.points if p.role == role)


def load_points(path: Path = POINTS_FILE) -> Published:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PublishedError([f"{path}: not valid YAML: {exc}"]) from None
    try:
        doc = PointsFile.model_validate(data)
    except ValidationError as exc:
        raise PublishedError([_issue(str(path), err) for err in exc.errors()]) from None
    sources = {k: Source(k, s.title, s.url, s.used_for) for k, s in doc.sources.items()}
    models = dict(MODEL_CATALOGUE)
    models.update({
        name: ModelSpec(name, params_b=m.params_b, layers=m.layers, hidden=m.hidden, kv_heads=m.kv_heads,
                        head_dim=m.head_dim, max_context=131072)
        for name, m in doc.models.items()
    })
    points = tuple(
        Point(
            id=p.id,
            source=sources[p.source],
            url=f"{sources[p.source].url}/{p.file}",
            model=models[p.model],
            gpu=GPU_CATALOGUE[p.gpu],
            tensor_parallel=p.tensor_parallel,
            precision=p.precision,
            task=p.task,
            input_tokens=doc.tasks[p.task].input_tokens,
            max_num_seqs=p.max_num_seqs,
            batch=p.batch,
            output_tokens=p.output_tokens,
            output_spread=p.output_spread,
            j_per_token=p.j_per_token,
            tokens_per_s=p.tokens_per_s,
            role=p.role,
            note=doc.notes.get(p.note, ""),
        )
        for p in doc.points
    )
    return Published(
        MappingProxyType(sources), MappingProxyType(dict(doc.tasks)), MappingProxyType(dict(doc.notes)), points,
        str(path),
    )


def predicted_j_per_token(costs: StepCosts, point: Point) -> float:
    """The model's steady-state energy per output token at ``point`` (module doc)."""
    energy, _ = predict(RatedCosts(costs, 0.0, ""), point.batch, point.context)
    i, o = point.input_tokens, point.output_tokens
    per_request = (
        energy.prefill_joules(i, 0)
        + o * energy.step_j
        + energy.step_j_per_context_token * (o * i + point.output_spread * o * o * 0.5)
    )
    return per_request / o


def predicted_tokens_per_s(costs: StepCosts, point: Point) -> float:
    """The model's steady-state output throughput at ``point`` (module doc)."""
    b, i, o = point.batch, float(point.input_tokens), point.output_tokens
    budget = prefill_budget(costs, b)
    step = costs.t_step + b * (costs.t_token + point.context * (costs.t_kv + costs.t_pair))
    prefill = (b / o) * (i * costs.t_token + i * i * 0.5 * (costs.t_pair + costs.t_kv / budget))
    return b / (step + prefill)


def _issue(path: str, err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(document)"
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    return f"{path}: {where}: {err['msg']}{shown}"
