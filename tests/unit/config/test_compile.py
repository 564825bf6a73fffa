"""The compiled fleet and policies: the same values as the files, in plain runtime objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from scheduler.config import schema
from scheduler.config.compile import FILE_ONLY, RUNTIME, compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.fleet import Candidate, Fleet


def test_each_runtime_class_has_its_schema_class_fields() -> None:
    for config_class, runtime in RUNTIME.items():
        in_files = set(config_class.model_fields) - FILE_ONLY.get(config_class, frozenset())
        at_runtime = {f.name for f in dataclasses.fields(runtime)}
        assert at_runtime == in_files, (f"{runtime.__name__} and {config_class.__name__} differ: only at runtime "
                                        f"{sorted(at_runtime - in_files)}, only in the files {sorted(in_files - at_runtime)}")
        assert runtime.__dataclass_params__.frozen and hasattr(runtime, "__slots__"), runtime.__name__


def test_every_model_a_file_holds_has_a_runtime_class() -> None:
    def models_in(cls: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
        seen.add(cls)
        for name, info in cls.model_fields.items():
            if name in FILE_ONLY.get(cls, frozenset()):
                continue
            for arg in _type_args(info.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in seen:
                    models_in(arg, seen)
        return seen

    reachable = models_in(schema.RegionConfig, set()) | models_in(schema.PolicyConfig, set())
    assert reachable - set(RUNTIME) == set()


def _type_args(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _type_args(arg)


def _same(config: Any, runtime: Any, where: str) -> None:
    """``runtime`` holds ``config``'s values, field by field, with no pydantic model left."""
    assert not isinstance(runtime, BaseModel), f"{where}: a pydantic model at runtime"
    if isinstance(config, BaseModel):
        assert type(runtime) is RUNTIME[type(config)], where
        for f in dataclasses.fields(runtime):
            _same(getattr(config, f.name), getattr(runtime, f.name), f"{where}.{f.name}")
    elif isinstance(config, tuple):
        assert type(runtime) is tuple and len(runtime) == len(config), where
        for i, (a, b) in enumerate(zip(config, runtime, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(config, dict):
        assert dict(runtime).keys() == config.keys(), where
        with pytest.raises(TypeError):
            runtime["added"] = 1  # read-only
        for key in config:
            _same(config[key], runtime[key], f"{where}[{key!r}]")
    else:
        assert runtime is config or runtime == config, where


EXAMPLE_FLEETS = Path(__file__).resolve().parents[3] / "examples" / "fleets"


@pytest.mark.parametrize("regions_dir", [None, *sorted(p / "regions" for p in EXAMPLE_FLEETS.iterdir()
                                                      if (p / "regions").is_dir())],
                         ids=lambda p: "shipped" if p is None else p.parent.name)
def test_the_fleets_compile_to_their_files_values(regions_dir: Path | None) -> None:
    files = load_fleet(regions_dir)
    fleet = compile_fleet(files.regions)
    for config, region in zip(files.regions, fleet.regions, strict=True):
        _same(config, region, config.name)
    for name, policy in files.policies.items():
        _same(policy, compile_policy(policy), name)
    _indices_hold(fleet)


def _indices_hold(fleet: Fleet) -> None:
    expected = [(region, pool, deployment) for region in fleet.regions for pool in region.pools
                for deployment in pool.models]
    assert [(c.region, c.pool, c.deployment) for c in fleet.candidates] == expected
    assert all(c.index == i for i, c in enumerate(fleet.candidates))
    by_model: dict[str, list[Candidate]] = {}
    for c in fleet.candidates:
        by_model.setdefault(c.deployment.name, []).append(c)
    assert {name: list(group) for name, group in fleet.candidates_by_model.items()} == by_model
    assert [c for pool in fleet.pools for c in pool] == list(fleet.candidates)
    assert all(len({(c.region.name, c.pool.name) for c in pool}) == 1 for pool in fleet.pools)
    assert all(c.kv_capacity_tokens <= c.deployment.max_context for c in fleet.candidates)
