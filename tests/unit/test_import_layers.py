"""The packages import each other in one direction: no import circle between any two parts of
``scheduler`` (a circle makes a part impossible to load, test or replace on its own)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scheduler"


def part(module: str) -> str:
    """scheduler.framework.columns -> scheduler.framework; scheduler.types -> scheduler.types."""
    return ".".join(module.split(".")[:2])


def imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        if "v1" in path.relative_to(ROOT).parts:
            continue
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler"):
                targets = [f"scheduler.{a.name}" for a in node.names] if node.module == "scheduler" else [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("scheduler")]
            for target in targets:
                if part(target) != part(module):
                    graph[part(module)].add(part(target))
    return graph


def test_no_import_circle_between_parts() -> None:
    graph = imports()
    assert graph["scheduler.framework"], "the walk found no imports: the test would prove nothing"

    def reaching(start: str) -> set[str]:
        """Every part ``start`` imports, directly or not."""
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted(f"{a} -> ... -> {a}" for a in list(graph) if a in reaching(a))
    assert circles == []


def test_the_core_does_not_import_the_layers_above_it() -> None:
    graph = imports()
    assert not graph["scheduler.types"] & {"scheduler.framework", "scheduler.plugins", "scheduler.datalayer"}
    assert not graph["scheduler.energy"] & {"scheduler.types", "scheduler.framework", "scheduler.config"}
    assert not graph["scheduler.framework"] & {"scheduler.plugins", "scheduler.datalayer", "scheduler.server"}
    assert not graph["scheduler.ledger"] & {"scheduler.server"}
