"""A problem in the config files, named by file, field and message (``ConfigIssue``), and the
error that carries every one found (``ConfigError``): what the loader (scheduler.config.loader)
and the plugin registry's policy check (scheduler.framework.registry) report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}" if self.field else f"{self.file}: {self.message}"


class ConfigError(Exception):
    """One or more problems in the config files; ``issues`` lists each."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


def field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.startswith(("function-", "json-or-python")) or part == "[key]":  # a mapping's key: named before
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"
