"""The packages import each other in one direction: no import circle between any two parts of
``scheduler``, nor between any two of its modules (a circle makes a part impossible to load, test
or replace on its own), and the lower layers import nothing of those above them."""

from __future__ import annotations

import ast
import os
import sys
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
    # The data layer builds snapshots (and their delta) from the stores; it needs nothing of the
    # framework that decides on them (their columns and caches are the framework's own).
    assert graph["scheduler.datalayer"], "the walk found no imports in scheduler.datalayer"
    assert not graph["scheduler.datalayer"] & {"scheduler.framework", "scheduler.server"}


# The router's parts: the SDK (scheduler.client, shipped alone as carbon-scheduler-sdk) and the
# wire layer it shares with the router never import them, so the SDK installs without them.
ROUTER_PARTS = frozenset({"scheduler.server", "scheduler.region", "scheduler.datalayer", "scheduler.framework",
                          "scheduler.config", "scheduler.sim"})
# What the SDK's wheel is built from: links to the modules it is made of (sdk/pyproject.toml).
SDK_TREE = ROOT.parent / "sdk" / "scheduler"


def test_the_sdk_and_its_wire_layer_do_not_import_the_router() -> None:
    graph = imports()
    for sdk_part in ("scheduler.client", "scheduler.wire"):
        assert graph[sdk_part], f"the walk found no imports in {sdk_part}: the test would prove nothing"
        assert not graph[sdk_part] & ROUTER_PARTS, f"{sdk_part} imports {sorted(graph[sdk_part] & ROUTER_PARTS)}"


def module_path(module: str) -> Path | None:
    """The file of a ``scheduler`` module or package; None for a name that is neither (a class)."""
    base = ROOT.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_imports(module: str) -> set[str]:
    """The ``scheduler`` modules ``module`` imports anywhere in its file (a function's lazy
    import too), with the packages above each (importing a module runs their ``__init__``)."""
    path = module_path(module)
    assert path is not None, module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("scheduler")]
        for name in names:
            parts = name.split(".")
            found.update(m for i in range(1, len(parts) + 1) if module_path(m := ".".join(parts[:i])) is not None)
    return found


def test_the_sdk_wheel_carries_every_module_the_sdk_imports_and_no_other() -> None:
    reached: set[str] = set()
    todo = [f"scheduler.client.{p.stem}".removesuffix(".__init__") for p in (ROOT / "client").glob("*.py")]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(module_imports(module))
    shipped = {".".join((Path(folder) / name).relative_to(SDK_TREE.parent).with_suffix("").parts)
               .removesuffix(".__init__")
               for folder, _, names in os.walk(SDK_TREE, followlinks=True)  # (rglob would not enter the links)
               for name in names if name.endswith(".py")}
    assert len(shipped) > 10, f"{SDK_TREE}: found {sorted(shipped)}; are its links intact?"
    router = sorted(m for m in reached if part(m) in ROUTER_PARTS)
    assert not router, f"the SDK reaches the router's {router}"
    missing = sorted(reached - shipped)
    assert not missing, f"the SDK imports {missing}, which its wheel would not carry: link them under {SDK_TREE}"
    # The generated stubs go as a whole; any other link the SDK does not import is dead weight.
    unused = sorted(m for m in shipped - reached if part(m) != "scheduler.v1")
    assert not unused, f"{SDK_TREE} links {unused}, which the SDK does not import"


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the ``scheduler`` modules its file imports: at the top, in a function (a lazy
    import that dodges a circle still makes one) and under ``if TYPE_CHECKING:`` (a type-only
    import is still a dependency; the circles opened in issue 29 all closed through one). A
    name imported from a module counts as that module; a package as its ``__init__``. The
    generated stubs (scheduler/v1) are left out."""
    package = root / "scheduler"
    files = {".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
             for path in package.rglob("*.py") if "v1" not in path.relative_to(package).parts}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {module: set() for module in files}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("scheduler")]
            for name in names:
                target = known(name)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for module in sorted(graph):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_modules() -> None:
    graph = module_graph(ROOT.parent)
    assert len(graph) > 100 and graph["scheduler.server.app"], "the walk found no imports: the test would prove nothing"
    shown = []
    for circle in circles(graph):
        shown.append("a circle of " + ", ".join(str(module_path(m).relative_to(ROOT.parent)) for m in circle))
        shown.extend(f"  {m} imports {', '.join(sorted(graph[m] & set(circle)))}" for m in circle)
    assert not shown, "modules that import each other, directly or through others:\n" + "\n".join(shown)


def reached(start: str) -> set[str]:
    """Every ``scheduler`` module importing ``start`` loads (anywhere in each file)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(module_imports(module))
    return seen


def test_registering_the_plugins_needs_no_config_loader() -> None:
    # The registration list (and the registry it fills) stands apart from reading files:
    # ``scheduler.plugins.checked_fleet`` joins the two.
    assert "scheduler.config.loader" in reached("scheduler.plugins.checked_fleet"), "the walk would prove nothing"
    for module in ("scheduler.plugins", "scheduler.framework.registry"):
        assert "scheduler.config.loader" not in reached(module), f"{module} loads scheduler.config.loader"


def test_the_runtime_types_do_not_load_the_config() -> None:
    # scheduler.config.compile turns the files' pydantic models into the plain runtime objects
    # (scheduler.fleet, scheduler.policy): the snapshot's types load nothing of the config, and
    # the framework, the data layer's snapshot builder and the plugins decide without the schema
    # (the registry reports problems as scheduler.config.issues' plain records).
    assert "scheduler.config.schema" in reached("scheduler.config.compile"), "the walk would prove nothing"
    for module in ("scheduler.types", "scheduler.fleet", "scheduler.policy"):
        loaded = sorted(m for m in reached(module) if m.startswith("scheduler.config"))
        assert not loaded, f"{module} loads {', '.join(loaded)}"
    schema = {"scheduler.config.schema", "scheduler.config.loader", "scheduler.config.compile"}
    for module in ("scheduler.framework.scheduler", "scheduler.datalayer.snapshot", "scheduler.plugins"):
        loaded = sorted(reached(module) & schema)
        assert not loaded, f"{module} loads {', '.join(loaded)}"
