"""Reading infra/: its YAML documents, kustomizations, the rendering script and the router's
container, for the manifest tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
INFRA = REPO / "infra"


@dataclass(frozen=True)
class Doc:
    path: Path
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.body.get("metadata", {}).get("name", ""))


def yaml_files() -> list[Path]:
    return sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])


def docs() -> Iterator[Doc]:
    for path in yaml_files():
        for body in yaml.safe_load_all(path.read_text()):
            if isinstance(body, dict):
                yield Doc(path, body)


def manifests(kind: str) -> list[Doc]:
    """Kubernetes objects of ``kind`` (kustomize patches excluded: they are partial)."""
    return [d for d in docs() if d.kind == kind and "overlays" not in d.path.parts]


def one(kind: str, name: str) -> Doc:
    found = [d for d in manifests(kind) if d.name == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {[str(d.path) for d in found]}"
    return found[0]


def kustomizations() -> list[Path]:
    return sorted(INFRA.rglob("kustomization.yaml"))


def load_render() -> ModuleType:
    """infra/render.py (a script, not a package)."""
    name = "infra_render"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, INFRA / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def container(doc: Doc, name: str) -> dict[str, Any]:
    spec = doc.body["spec"]["template"]["spec"]
    found = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"{doc.path}: no single container {name!r}"
    return dict(found[0])


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in a container's args."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None
