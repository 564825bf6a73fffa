"""Plugins are pure math: every filter, scorer and matcher module is short and holds no cache
of its own (the framework keeps their state, scheduler.framework.state)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import scheduler.plugins

PLUGINS = Path(scheduler.plugins.__file__).parent
MODULES = sorted(p for kind in ("filters", "scorers", "matchers") for p in (PLUGINS / kind).glob("*.py")
                 if p.name != "__init__.py")
MAX_LINES = 80


def cache_code(source: str) -> list[str]:
    """What in ``source`` reads as cache code: the snapshot's old cache bag, a memo, an ``id()``
    key, or a dict kept at module or class level (a cache that outlives a call)."""
    found = re.findall(r"\b(column_cache|memo|\w*_memo|memoi[sz]e\w*)\b", source)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
            found.append(f"id() at line {node.lineno}")
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        for statement in scope.body:
            value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Dict | ast.DictComp) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id in ("dict", "defaultdict", "OrderedDict", "WeakKeyDictionary", "lru_cache")):
                found.append(f"a dict kept at line {statement.lineno}")
        found += [f"functools cache at line {d.lineno}" for n in ast.walk(scope) if isinstance(n, ast.FunctionDef)
                  for d in n.decorator_list if "cache" in ast.unparse(d) and "cached_property" not in ast.unparse(d)]
    return found


def test_the_plugin_modules_are_found() -> None:
    assert len(MODULES) >= 15 and {p.name for p in MODULES} >= {"carbon.py", "pool_served.py", "region_health.py"}


@pytest.mark.parametrize("module", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_plugin_module_is_under_80_lines(module: Path) -> None:
    lines = len(module.read_text().splitlines())
    assert lines < MAX_LINES, f"{module.name}: {lines} lines"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_plugin_module_holds_no_cache(module: Path) -> None:
    assert cache_code(module.read_text()) == []


@pytest.mark.parametrize("source", [
    "cache = snapshot.column_cache",
    "x = memo(snapshot, key, anchor, compute)",
    "self._label_memo.get(key)",
    "key = (id(plugin), model)",
    "_SEEN: dict[int, int] = {}",
    "class C:\n    kept = dict()",
    "import functools\n@functools.lru_cache\ndef f(x):\n    return x",
])
def test_the_check_finds_cache_code(source: str) -> None:
    assert cache_code(source)
