"""Energy profiles: YAML files (``scheduler/energy/profiles/*.yaml``), one per (model, GPU).

A profile holds the batch-independent terms of one replica (``ReplicaEnergy``) at the
precision and tensor-parallel degree it was measured or derived for, how they were
obtained (``method``: calibrated on a GPU with ``scheduler calibrate``, anchored to a
published measurement, or scaled from an anchored profile by the physics model) and the
sources it rests on. Loading is strict: an error names the file, the field path and the
value.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model import ReplicaEnergy
from scheduler.energy.models import MODEL_CATALOGUE, PRECISION_BYTES

EMBEDDED_PROFILES = Path(__file__).parent / "profiles"
SCHEMA_VERSION = 1


class ProfileError(ValueError):
    """One or more profile files are invalid; ``issues`` lists 'file: field: problem'."""

    def __init__(self, issues: list[str]) -> None:
        super().__init__("\n".join(issues))
        self.issues = issues


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    # What the source says that this profile uses (quoted figure or finding).
    used_for: str = Field(min_length=1)


class Coefficients(_Strict):
    prefill_j_per_token: float = Field(ge=0)
    start_j: float = Field(ge=0)
    step_weights_j: float = Field(gt=0)
    step_seq_j: float = Field(ge=0)
    step_kv_j_per_token: float = Field(ge=0)
    idle_w: float = Field(ge=0)


class ProfileFile(_Strict):
    schema_version: Literal[1]
    model: str
    gpu: str
    precision: str
    tensor_parallel: int = Field(ge=1)
    method: Literal["calibrated", "anchored", "scaled"]
    date: dt.date
    rel_error: float = Field(gt=0, lt=1)
    coefficients: Coefficients
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


@dataclass(frozen=True, slots=True)
class EnergyProfile:
    model: str
    gpu: str
    precision: str
    tensor_parallel: int
    method: str
    date: dt.date
    rel_error: float
    replica: ReplicaEnergy
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
    c = doc.coefficients
    return EnergyProfile(
        model=doc.model,
        gpu=doc.gpu,
        precision=doc.precision,
        tensor_parallel=doc.tensor_parallel,
        method=doc.method,
        date=doc.date,
        rel_error=doc.rel_error,
        replica=ReplicaEnergy(
            c.prefill_j_per_token, c.start_j, c.step_weights_j, c.step_seq_j, c.step_kv_j_per_token, c.idle_w
        ),
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
    """The YAML document of a profile (what ``calibrate`` and ``derive-profiles`` write)."""
    r = profile.replica
    return {
        "schema_version": SCHEMA_VERSION,
        "model": profile.model,
        "gpu": profile.gpu,
        "precision": profile.precision,
        "tensor_parallel": profile.tensor_parallel,
        "method": profile.method,
        "date": profile.date.isoformat(),
        "rel_error": round(profile.rel_error, 4),
        "coefficients": {
            "prefill_j_per_token": _sig(r.prefill_j_per_token),
            "start_j": _sig(r.start_j),
            "step_weights_j": _sig(r.step_weights_j),
            "step_seq_j": _sig(r.step_seq_j),
            "step_kv_j_per_token": _sig(r.step_kv_j_per_token),
            "idle_w": _sig(r.idle_w),
        },
        "sources": [s.model_dump() for s in profile.sources],
        "derivation": derivation,
    }


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
    return float(f"{value:.5g}")
