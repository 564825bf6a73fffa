"""The plugin registry: TYPE -> plugin class, filled by ``plugins.register_all`` (the one
list of plugin names), and the checking and compiling of a policy's plugin lists against it.

A plugin class is a frozen dataclass whose fields are its parameters. ``check`` validates a
policy against the registry and reports every problem with the policy file and the field
path (unknown TYPE, a parameter the plugin lacks or of the wrong type, a rate whose unit
does not price the scorer's quantity, an energy-layer scorer in the fallback objective).
``compile`` turns a checked policy into a ``Plan``: the plugin instances and each term's
rate in USD per the scorer's unit, per workload class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from scheduler.config.issues import ConfigIssue, field_path
from scheduler.framework.plugin import CandidateSource, Filter, Picker, Scorer
from scheduler.policy import PluginRef, Policy, ScorerTerm
from scheduler.rates import UNITS
from scheduler.types import WORKLOAD_CLASSES

PluginT = TypeVar("PluginT")


@dataclass(frozen=True)
class Term:
    """One term of an objective: ``scorer``'s quantity x ``rates[class]`` (USD per unit)."""

    scorer: Scorer
    # Per workload class (WORKLOAD_CLASSES order): USD per the scorer's unit, and as written.
    rates: tuple[float, ...]
    written: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A policy compiled against the registry: what runs for it."""

    matchers: tuple[Filter, ...]
    primary: tuple[Term, ...]
    fallback: tuple[Term, ...]


@dataclass
class Registry:
    sources: dict[str, type[CandidateSource]] = field(default_factory=dict)
    filters: dict[str, type[Filter]] = field(default_factory=dict)
    matchers: dict[str, type[Filter]] = field(default_factory=dict)
    scorers: dict[str, type[Scorer]] = field(default_factory=dict)
    pickers: dict[str, type[Picker]] = field(default_factory=dict)

    def source(self, name: str, plugin: type[CandidateSource]) -> None:
        _add(self.sources, name, plugin)

    def filter(self, name: str, plugin: type[Filter]) -> None:
        _add(self.filters, name, plugin)

    def matcher(self, name: str, plugin: type[Filter]) -> None:
        _add(self.matchers, name, plugin)

    def scorer(self, name: str, plugin: type[Scorer]) -> None:
        if plugin.UNIT not in UNITS:
            raise ValueError(f"scorer {name!r} reports an unknown unit {plugin.UNIT!r} (known: {', '.join(UNITS)})")
        _add(self.scorers, name, plugin)

    def picker(self, name: str, plugin: type[Picker]) -> None:
        _add(self.pickers, name, plugin)

    def describe(self) -> dict[str, Any]:
        """The plugins a policy may name: per kind, each TYPE with its parameters' JSON Schema
        (and a scorer's unit, and whether it is in the energy layer)."""
        out: dict[str, Any] = {
            "filters": {name: {"parameters": _adapter(p).json_schema()} for name, p in self.filters.items()},
            "matchers": {name: {"parameters": _adapter(p).json_schema()} for name, p in self.matchers.items()},
            "scorers": {
                name: {"parameters": _adapter(p).json_schema(), "unit": p.UNIT, "energy_layer": p.ENERGY_LAYER}
                for name, p in self.scorers.items()
            },
        }
        return out

    # --- policies --------------------------------------------------------------------------

    def check(self, policy: Policy, source: str) -> list[ConfigIssue]:
        """Every problem of ``policy``'s plugin lists (empty: it compiles)."""
        issues: list[ConfigIssue] = []
        for i, ref in enumerate(policy.matchers):
            self._make(self.matchers, "matcher", ref, f"matchers[{i}]", source, issues)
        for section, terms in (("scorers", policy.scorers), ("fallback.scorers", policy.fallback.scorers)):
            seen: set[str] = set()
            for i, term in enumerate(terms):
                where = f"{section}[{i}]"
                if term.type in seen:
                    issues.append(ConfigIssue(source, f"{where}.type", f"{term.type!r} is listed twice in {section}"))
                seen.add(term.type)
                scorer = self._make(self.scorers, "scorer", term, where, source, issues)
                if scorer is None:
                    continue
                if section != "scorers" and scorer.ENERGY_LAYER:
                    issues.append(ConfigIssue(
                        source, f"{where}.type",
                        f"{term.type!r} is an energy-layer scorer; the fallback objective ranks without "
                        "energy and carbon signals (it is what runs when they are stale or switched off)",
                    ))
                try:
                    _rates(term, scorer)
                except ValueError as exc:
                    issues.append(ConfigIssue(source, f"{where}.rate", f"{term.type} reports {scorer.UNIT}: {exc}"))
        return issues

    def compile(self, policy: Policy) -> Plan:
        """The plugins and rates of ``policy`` (raises ValueError listing every problem)."""
        issues = self.check(policy, f"policy {policy.name!r}")
        if issues:
            raise ValueError("\n".join(str(issue) for issue in issues))
        scratch: list[ConfigIssue] = []

        def terms(items: tuple[ScorerTerm, ...]) -> tuple[Term, ...]:
            out = []
            for term in items:
                scorer = self._make(self.scorers, "scorer", term, "", "", scratch)
                assert scorer is not None
                rates, written = _rates(term, scorer)
                out.append(Term(scorer, rates, written))
            return tuple(out)

        matchers = tuple(self._make(self.matchers, "matcher", ref, "", "", scratch) for ref in policy.matchers)
        return Plan(
            matchers=tuple(m for m in matchers if m is not None),
            primary=terms(policy.scorers),
            fallback=terms(policy.fallback.scorers),
        )

    def _make(
        self, table: Mapping[str, type[PluginT]], kind: str, ref: PluginRef | ScorerTerm, where: str, source: str,
        issues: list[ConfigIssue],
    ) -> PluginT | None:
        plugin = table.get(ref.type)
        if plugin is None:
            issues.append(ConfigIssue(
                source, f"{where}.type", f"{ref.type!r} is not a registered {kind} (known: {', '.join(table)})"))
            return None
        try:
            made: PluginT = _adapter(plugin).validate_json(json.dumps(ref.parameters, default=dict))
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                path = field_path(tuple(err["loc"]))
                issues.append(ConfigIssue(source, f"{where}.parameters.{path}", _describe(err, ref.type)))
            return None
        return made


def _describe(err: Mapping[str, Any], plugin: str) -> str:
    if err["type"] == "unexpected_keyword_argument" or err["type"] == "extra_forbidden":
        return f"{plugin} has no parameter by this name"
    return f"{err['msg']}, got {err.get('input')!r}"


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(plugin: type[PluginT]) -> TypeAdapter[PluginT]:
    adapter = _ADAPTERS.get(plugin)
    if adapter is None:
        adapter = TypeAdapter(plugin)
        _ADAPTERS[plugin] = adapter
    return adapter


def _rates(term: ScorerTerm, scorer: Scorer) -> tuple[tuple[float, ...], tuple[str, ...]]:
    unit = UNITS[scorer.UNIT]
    by_class = [term.rate_for(name) for name in WORKLOAD_CLASSES]
    return tuple(rate.usd_per(unit) for rate in by_class), tuple(str(rate) for rate in by_class)


def _add(table: dict[str, type[PluginT]], name: str, plugin: type[PluginT]) -> None:
    if name in table:
        raise ValueError(f"plugin {name!r} registered twice")
    if getattr(plugin, "TYPE", name) != name:
        raise ValueError(f"plugin {plugin.__name__} has TYPE {getattr(plugin, 'TYPE', None)!r}, registered as {name!r}")
    table[name] = plugin
