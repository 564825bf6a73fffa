"""Reading ``regions/`` and ``policies/`` in named steps: parse, default, validate, build.

- parse:    YAML text -> a mapping (syntax errors name the file and line)
- default:  fill the defaults that depend on other fields, visibly (never over a bad value)
- validate: pydantic, strict; every error names the file, the field path and the bad value
- build:    cross-file checks (unique names, at least one region and policy, each canary's arm
            another policy, each policy's plugins and rates against the plugin registry) -> ``FleetConfig``

Every problem found is reported, not just the first, so an operator fixes a file once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

# What the loader raises, named from here too (its callers import them with it).
from scheduler.config.autoscaling import models_that_may_all_be_cold
from scheduler.config.compile import compile_policy
from scheduler.config.issues import ConfigError as ConfigError
from scheduler.config.issues import ConfigIssue as ConfigIssue
from scheduler.config.issues import field_path
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.policy import Policy

PROJECT_DIR = Path(__file__).resolve().parent.parent.parent
# The example configs shipped inside the package, what `make demo` runs on and what a command
# reads when given no folder and none is in the working directory. In a checkout
# scheduler/examples/regions and .../policies are links to the project's regions/ and
# policies/ (the one copy operators edit); a wheel holds the files themselves.
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EMBEDDED_REGIONS = EXAMPLES_DIR / "regions"
EMBEDDED_POLICIES = EXAMPLES_DIR / "policies"

DEFAULT_CARBON_POLL_S = 300.0

ModelT = TypeVar("ModelT", bound=BaseModel)


class PolicyChecker(Protocol):
    """Checks a policy's plugin lists (the plugin registry, ``scheduler.framework.registry``)."""

    def check(self, policy: Policy, source: str) -> list[ConfigIssue]: ...


@dataclass(frozen=True)
class FleetConfig:
    regions: tuple[RegionConfig, ...]
    policies: Mapping[str, PolicyConfig]
    regions_dir: Path
    policies_dir: Path
    # What is valid but likely not meant (``config validate`` prints them, the router logs them).
    warnings: tuple[str, ...] = ()

    def policy(self, name: str) -> PolicyConfig:
        try:
            return self.policies[name]
        except KeyError:
            known = ", ".join(sorted(self.policies))
            raise ConfigError(
                [ConfigIssue(str(self.policies_dir), "", f"no policy named {name!r} (known: {known})")]
            ) from None


# --- parse -------------------------------------------------------------------------------


def parse(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigIssue(str(path), "", f"{where}invalid YAML: {problem}")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue(str(path), "", f"cannot read: {exc.strerror}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigIssue(str(path), "", f"expected a mapping at the top level, got {type(data).__name__}")]
        )
    return data


# --- default -----------------------------------------------------------------------------


def default_region(raw: dict[str, Any]) -> dict[str, Any]:
    """A region's carbon source defaults to CSV replay of its grid zone; a pool's power cap
    to its GPU's TDP; a plain vLLM region's endpoint (what the routers probe, and list) to its
    pools' first server. Only absent keys are filled; a present but bad value stays for
    validation to report."""
    region = dict(raw)
    if region.get("kind") == "vllm" and "endpoint" not in region:
        first = _first_vllm_url(region.get("pools"))
        if first is not None:
            region["endpoint"] = first
    carbon = region.get("carbon", {})
    if isinstance(carbon, dict):
        carbon = dict(carbon)
        carbon.setdefault("provider", "csv")
        if "grid_zone" in region:
            carbon.setdefault("zone", region["grid_zone"])
        carbon.setdefault("poll_interval_s", DEFAULT_CARBON_POLL_S)
        region["carbon"] = carbon
    pools = region.get("pools")
    if isinstance(pools, list):
        filled = []
        for pool in pools:
            if isinstance(pool, dict) and "power_cap_w" not in pool:
                spec = GPU_CATALOGUE.get(str(pool.get("gpu")))
                if spec is not None:
                    pool = {**pool, "power_cap_w": spec.tdp_w}
            filled.append(pool)
        region["pools"] = filled
    return region


def _first_vllm_url(pools: object) -> str | None:
    """The first server URL of the region's pools (one validation would refuse is passed over:
    its pool's error names it, the endpoint's would only repeat it)."""
    if not isinstance(pools, list):
        return None
    for pool in pools:
        servers = pool.get("vllm") if isinstance(pool, dict) else None
        urls = servers.get("urls") if isinstance(servers, dict) else None
        for url in urls if isinstance(urls, list) else ():
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                return url
    return None


# --- validate ----------------------------------------------------------------------------


def _describe(error: Mapping[str, Any]) -> str:
    message = str(error["msg"])
    if message.startswith("Value error, "):
        return message.removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return "unknown key (not part of the schema)"
    if error["type"] == "missing":
        return "required field is missing"
    return f"{message}, got {error.get('input')!r}"


def validate(model: type[ModelT], raw: Mapping[str, Any], source: str) -> ModelT:
    # JSON mode keeps strict typing (no '8' -> 8) while accepting YAML lists for tuples.
    try:
        return model.model_validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise ConfigError(
            ConfigIssue(source, field_path(tuple(err["loc"])), _describe(err))
            for err in errors if not _echo_of_item_error(err, errors)
        ) from None


def _echo_of_item_error(error: Mapping[str, Any], errors: Sequence[Mapping[str, Any]]) -> bool:
    """Pydantic follows an item's error in a tuple with a minimum length by "should have at
    least 1 item after validation, not 0" for that tuple and each one around it: the item's
    error says what to fix; these only repeat it."""
    if error["type"] != "too_short" or "after validation" not in str(error["msg"]):
        return False
    loc = tuple(error["loc"])
    return any(len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors)


# --- build -------------------------------------------------------------------------------


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise ConfigError([ConfigIssue(str(directory), "", "not a directory")])
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not files:
        raise ConfigError([ConfigIssue(str(directory), "", "holds no *.yaml files")])
    return files


def load_region(path: Path) -> RegionConfig:
    return validate(RegionConfig, default_region(parse(path)), str(path))


def load_policy(path: Path) -> PolicyConfig:
    return validate(PolicyConfig, parse(path), str(path))


def _load_all(paths: list[Path], load: Any) -> tuple[list[Any], list[ConfigIssue]]:
    loaded: list[tuple[Path, Any]] = []
    issues: list[ConfigIssue] = []
    for path in paths:
        try:
            loaded.append((path, load(path)))
        except ConfigError as exc:
            issues.extend(exc.issues)
    return loaded, issues


def _check_unique(items: list[tuple[Path, Any]], what: str) -> list[ConfigIssue]:
    seen: dict[str, Path] = {}
    issues = []
    for path, item in items:
        if item.name in seen:
            issues.append(
                ConfigIssue(str(path), "name", f"{what} {item.name!r} is also defined in {seen[item.name]}")
            )
        seen.setdefault(item.name, path)
    return issues


def _check_canaries(policies: list[tuple[Path, PolicyConfig]]) -> list[ConfigIssue]:
    """Each policy's canary arm is another policy of the folder, without a canary of its own."""
    by_name = {policy.name: policy for _, policy in policies}
    issues = []
    for path, policy in policies:
        canary = policy.canary
        if canary is None:
            continue
        arm = by_name.get(canary.arm)
        if canary.arm == policy.name:
            issues.append(ConfigIssue(str(path), "canary.arm", f"the arm must be another policy, not {policy.name!r} "
                                                               "itself"))
        elif arm is None:
            known = ", ".join(sorted(name for name in by_name if name != policy.name)) or "none"
            issues.append(ConfigIssue(str(path), "canary.arm", f"no policy named {canary.arm!r} (known: {known})"))
        elif arm.canary is not None:
            issues.append(ConfigIssue(str(path), "canary.arm", f"policy {canary.arm!r} has a canary of its own; an arm "
                                                               "cannot (its canary would never run)"))
    return issues


SHIPPED_CONFIG = {"regions": EMBEDDED_REGIONS, "policies": EMBEDDED_POLICIES}


def config_dir(kind: str, given: Path | None, cwd: Path) -> Path:
    """The ``kind`` ("regions" or "policies") folder a command reads: the one given; else
    ``kind/`` in ``cwd`` when it exists (a checkout, a folder made by ``scheduler init``); else
    the examples shipped in the package."""
    if given is not None:
        return given
    local = cwd / kind
    return local if local.is_dir() else SHIPPED_CONFIG[kind]


def load_fleet(
    regions_dir: Path | None = None, policies_dir: Path | None = None, checker: PolicyChecker | None = None
) -> FleetConfig:
    """Load and check every region and policy file; raise one ConfigError listing all issues.

    ``checker`` also checks each policy's plugins (``scheduler.plugins.checked_fleet.load_checked_fleet``
    passes the registry; this layer does not know the plugins)."""
    regions_dir = regions_dir or EMBEDDED_REGIONS
    policies_dir = policies_dir or EMBEDDED_POLICIES
    issues: list[ConfigIssue] = []
    regions: list[tuple[Path, RegionConfig]] = []
    policies: list[tuple[Path, PolicyConfig]] = []
    try:
        regions, found = _load_all(_yaml_files(regions_dir), load_region)
        issues += found + _check_unique(regions, "region")
    except ConfigError as exc:
        issues.extend(exc.issues)
    try:
        policies, found = _load_all(_yaml_files(policies_dir), load_policy)
        issues += found + _check_unique(policies, "policy") + _check_canaries(policies)
        if checker is not None:
            for path, policy in policies:
                issues += checker.check(compile_policy(policy), str(path))
    except ConfigError as exc:
        issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    loaded = tuple(region for _, region in regions)
    return FleetConfig(
        regions=loaded,
        policies={policy.name: policy for _, policy in policies},
        regions_dir=regions_dir,
        policies_dir=policies_dir,
        warnings=tuple(
            f"{regions_dir}: model {model}: every pool serving it may scale it to zero ({', '.join(pools)}): "
            "while all are at zero, requests whose TTFT budget is shorter than a cold start are refused and "
            "only those that can wait (deferrable) wake a pool; give one pool min_replicas >= 1 to serve "
            "interactive requests at once"
            for model, pools in models_that_may_all_be_cold(loaded).items()),
    )


def json_schemas() -> dict[str, Any]:
    return {
        "region": RegionConfig.model_json_schema(),
        "policy": PolicyConfig.model_json_schema(),
    }
