"""Plugin registry: TYPE name -> plugin factory, filled by ``plugins.register_all``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from scheduler.framework.plugin import CandidateSource, Filter, Picker, Scorer

PluginT = TypeVar("PluginT")


@dataclass
class Registry:
    sources: dict[str, Callable[[], CandidateSource]] = field(default_factory=dict)
    filters: dict[str, Callable[[], Filter]] = field(default_factory=dict)
    matchers: dict[str, Callable[[], Filter]] = field(default_factory=dict)
    scorers: dict[str, Callable[[], Scorer]] = field(default_factory=dict)
    pickers: dict[str, Callable[[], Picker]] = field(default_factory=dict)

    def source(self, name: str, factory: Callable[[], CandidateSource]) -> None:
        _add(self.sources, name, factory)

    def filter(self, name: str, factory: Callable[[], Filter]) -> None:
        _add(self.filters, name, factory)

    def matcher(self, name: str, factory: Callable[[], Filter]) -> None:
        _add(self.matchers, name, factory)

    def scorer(self, name: str, factory: Callable[[], Scorer]) -> None:
        _add(self.scorers, name, factory)

    def picker(self, name: str, factory: Callable[[], Picker]) -> None:
        _add(self.pickers, name, factory)


def _add(table: dict[str, Callable[[], PluginT]], name: str, factory: Callable[[], PluginT]) -> None:
    if name in table:
        raise ValueError(f"plugin {name!r} registered twice")
    table[name] = factory
