"""Energy profiles: YAML files (``scheduler/energy/profiles/*.yaml``), one per (model, GPU).

A profile (schema version 2) holds the step costs of one replica (``StepCosts``: the time and
energy of an engine step as  c_step + c_token x tokens + c_kv x KV tokens read + c_pair x
attention pairs, see ``scheduler.energy.step``) at the precision and tensor-parallel degree it
was made for, how they were obtained and how sure they are:

- ``method: fitted``: the step costs are ``Roofline.costs(parameters)``: the physical parameters
  fitted to published measurements (``scheduler energy fit-profiles``; ``points`` lists the ids
  of ``published/points.yaml`` the fit used), with the catalogues' bandwidth, FLOP/s and power;
- ``method: calibrated``: fitted to a metered sweep on the pool itself (``scheduler calibrate``).

``rel_error`` is the interval's relative half-width and ``interval`` says which residuals set it;
``residuals`` summarises the fit. Loading is strict: an error names the file, the field path
and the value.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE, PRECISION_BYTES
from scheduler.energy.step import PhysicsAssumptions, StepCosts

EMBEDDED_PROFILES = Path(__file__).parent / "profiles"
SCHEMA_VERSION = 2


class ProfileError(ValueError):
    """One or more profile files are invalid; ``issues`` lists 'file: field: problem'."""

    def __init__(self, issues: list[str]) -> None:
        super().__init__("\n".join(issues))
        self.issues = issues


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    name: str = Field(min_length=1)
    url: str = Field(pattern=r"^https://")
    # What the source says that this profile uses (quoted figure or finding).
    used_for: str = Field(min_length=1)


class StepCostsDoc(_Strict):
    t_step: float = Field(gt=0)
    t_token: float = Field(ge=0)
    t_kv: float = Field(ge=0)
    t_pair: float = Field(ge=0)
    e_step: float = Field(gt=0)
    e_token: float = Field(ge=0)
    e_kv: float = Field(ge=0)
    e_pair: float = Field(ge=0)
    idle_w: float = Field(ge=0)
    max_num_seqs: int = Field(ge=1)
    max_batched_tokens: int = Field(ge=1)
    kv_capacity_tokens: int = Field(ge=0)


class ParametersDoc(_Strict):
    generation: str = Field(min_length=1)
    prefill_mfu: float = Field(gt=0)
    attention_mfu: float = Field(gt=0)
    bw_efficiency: float = Field(gt=0)
    kv_bw_efficiency: float = Field(gt=0)
    overhead_s: float = Field(gt=0)
    compute_power: float = Field(gt=0)
    memory_power: float = Field(gt=0)
    overhead_power: float = Field(gt=0)


class ResidualsDoc(_Strict):
    points: int = Field(ge=1)
    # Root-mean-square and largest relative error of the fit on the points it used.
    rms: float = Field(ge=0)
    max_abs: float = Field(ge=0)


class ProfileFile(_Strict):
    schema_version: Literal[2]
    model: str
    gpu: str
    precision: str
    tensor_parallel: int = Field(ge=1)
    method: Literal["calibrated", "fitted"]
    date: dt.date
    rel_error: float = Field(gt=0, lt=1)
    interval: str = Field(min_length=1)
    step_costs: StepCostsDoc
    parameters: ParametersDoc | None = None
    residuals: ResidualsDoc
    points: tuple[str, ...] = ()
    sources: tuple[Source, ...] = Field(min_length=1)
    derivation: str = Field(min_length=1)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in MODEL_CATALOGUE:
            raise ValueError(f"{value!r} is not a known model (known: {', '.join(MODEL_CATALOGUE)})")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in GPU_CATALOGUE:
            raise ValueError(f"{value!r} is not a known GPU (known: {', '.join(GPU_CATALOGUE)})")
        return value

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        if value not in PRECISION_BYTES:
            raise ValueError(f"{value!r} is not a known precision (known: {', '.join(PRECISION_BYTES)})")
        return value

    @model_validator(mode="after")
    def _fitted_has_parameters(self) -> ProfileFile:
        if self.method == "fitted" and (self.parameters is None or not self.points):
            raise ValueError("a fitted profile needs its parameters and the ids of the points it was fitted to")
        return self


@dataclass(frozen=True, slots=True)
class Residuals:
    points: int
    rms: float
    max_abs: float


@dataclass(frozen=True, slots=True)
class EnergyProfile:
    model: str
    gpu: str
    precision: str
    tensor_parallel: int
    method: str
    date: dt.date
    rel_error: float
    interval: str
    costs: StepCosts
    # The fitted physical parameters and their GPU generation (fitted profiles only).
    parameters: PhysicsAssumptions | None
    generation: str
    residuals: Residuals
    points: tuple[str, ...]
    sources: tuple[Source, ...]
    path: str

    @property
    def provenance(self) -> str:
        return f"profile: {self.gpu.lower()}-{self.model}@{self.method} {self.date.isoformat()}"


def parse_profile(data: Any, path: str) -> EnergyProfile:
    try:
        doc = ProfileFile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError([_issue(path, err) for err in exc.errors()]) from None
    p = doc.parameters
    return EnergyProfile(
        model=doc.model,
        gpu=doc.gpu,
        precision=doc.precision,
        tensor_parallel=doc.tensor_parallel,
        method=doc.method,
        date=doc.date,
        rel_error=doc.rel_error,
        interval=doc.interval,
        costs=StepCosts(**doc.step_costs.model_dump()),
        parameters=None if p is None else PhysicsAssumptions(
            **{f.name: getattr(p, f.name) for f in fields(PhysicsAssumptions)}),
        generation="" if p is None else p.generation,
        residuals=Residuals(doc.residuals.points, doc.residuals.rms, doc.residuals.max_abs),
        points=doc.points,
        sources=doc.sources,
        path=path,
    )


def load_profile(path: Path) -> EnergyProfile:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_profile(data, str(path))


def profile_document(profile: EnergyProfile, derivation: str) -> dict[str, Any]:
    """The YAML document of a profile (what ``calibrate`` and ``fit-profiles`` write)."""
    c = profile.costs
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": profile.model,
        "gpu": profile.gpu,
        "precision": profile.precision,
        "tensor_parallel": profile.tensor_parallel,
        "method": profile.method,
        "date": profile.date.isoformat(),
        "rel_error": round(profile.rel_error, 4),
        "interval": profile.interval,
        "step_costs": {f.name: _sig(getattr(c, f.name)) if isinstance(getattr(c, f.name), float)
                       else getattr(c, f.name) for f in fields(c)},
    }
    if profile.parameters is not None:
        doc["parameters"] = {"generation": profile.generation} | {
            f.name: _sig(getattr(profile.parameters, f.name)) for f in fields(profile.parameters)}
    doc["residuals"] = {"points": profile.residuals.points, "rms": round(profile.residuals.rms, 4),
                        "max_abs": round(profile.residuals.max_abs, 4)}
    doc["points"] = list(profile.points)
    doc["sources"] = [s.model_dump() for s in profile.sources]
    doc["derivation"] = derivation
    return doc


def write_profile(profile: EnergyProfile, derivation: str, path: Path) -> None:
    path.write_text(yaml.safe_dump(profile_document(profile, derivation), sort_keys=False, width=100))


@dataclass(frozen=True)
class ProfileLibrary:
    """Every profile of a folder, by (model, GPU)."""

    profiles: Mapping[tuple[str, str], EnergyProfile]

    @classmethod
    def load(cls, folder: Path = EMBEDDED_PROFILES) -> ProfileLibrary:
        return cls.of(sorted(folder.glob("*.yaml")))

    @classmethod
    def of(cls, paths: Iterable[Path]) -> ProfileLibrary:
        issues: list[str] = []
        found: dict[tuple[str, str], EnergyProfile] = {}
        for path in paths:
            try:
                profile = load_profile(path)
            except ProfileError as exc:
                issues.extend(exc.issues)
                continue
            key = (profile.model, profile.gpu)
            if key in found:
                issues.append(f"{path}: model/gpu: {key} already profiled in {found[key].path}")
                continue
            found[key] = profile
        if issues:
            raise ProfileError(issues)
        return cls(MappingProxyType(found))

    def get(self, model: str, gpu: str) -> EnergyProfile | None:
        return self.profiles.get((model, gpu))


def _issue(path: str, err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(document)"
    value = err.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"{path}: {where}: {err['msg']}{shown}"


def _sig(value: float) -> float:
    return float(f"{value:.6g}")
