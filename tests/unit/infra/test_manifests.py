"""Every file under infra/ parses, kustomize references resolve, and the objects fit together:
selectors match labels, ports match, mounted ConfigMaps and the files they carry exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.config.loader import load_fleet
from scheduler.ledger.budget import load_budgets
from tests.unit.infra.infra_files import INFRA, Doc, container, docs, kustomizations, manifests, one, yaml_files

WORKLOADS = ("Deployment", "StatefulSet")


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_file_parses(path: Path) -> None:
    loaded = list(yaml.safe_load_all(path.read_text()))
    assert loaded and all(isinstance(doc, dict) for doc in loaded), f"{path}: expected mappings"


def test_every_kubernetes_object_names_api_kind_and_name() -> None:
    objects = [d for d in docs() if "kind" in d.body and d.kind != "Kustomization"]
    assert len(objects) >= 15
    for doc in objects:
        assert doc.body.get("apiVersion"), f"{doc.path}: {doc.kind} without apiVersion"
        assert doc.name, f"{doc.path}: {doc.kind} without metadata.name"


def _entries(kustomization: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, relative path) of everything a kustomization reads from disk."""
    found = [("resource", r) for r in kustomization.get("resources", [])]
    for generator in kustomization.get("configMapGenerator", []) + kustomization.get("secretGenerator", []):
        found += [("generator file", f.split("=", 1)[-1]) for f in generator.get("files", [])]
    found += [("patch", p["path"]) for p in kustomization.get("patches", []) if "path" in p]
    return found


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: str(p.parent.relative_to(INFRA.parent)))
def test_kustomization_references_resolve(path: Path) -> None:
    kustomization = yaml.safe_load(path.read_text())
    assert kustomization["kind"] == "Kustomization"
    entries = _entries(kustomization)
    assert entries, f"{path}: references nothing"
    for what, rel in entries:
        target = (path.parent / rel).resolve()
        assert target.exists(), f"{path}: {what} {rel} does not exist"
        if target.is_dir():
            assert (target / "kustomization.yaml").exists(), f"{path}: {rel} is a folder without kustomization.yaml"
        # Kustomize's default load restrictor: generator files stay inside the kustomization's folder.
        if what == "generator file":
            assert target.is_relative_to(path.parent.resolve()), f"{path}: {rel} is outside {path.parent}"


def test_every_infra_manifest_is_reachable_from_the_top_kustomization() -> None:
    reached: set[Path] = set()

    def walk(folder: Path) -> None:
        for what, rel in _entries(yaml.safe_load((folder / "kustomization.yaml").read_text())):
            target = (folder / rel).resolve()
            if target.is_dir():
                walk(target)
            elif what == "resource":
                reached.add(target)

    walk(INFRA)
    objects = {
        d.path.resolve() for d in docs()
        if "kind" in d.body and d.kind != "Kustomization" and "overlays" not in d.path.parts
    }
    assert objects - reached == set(), "manifests no kustomization applies"


def _pod_labels(workload: Doc) -> dict[str, str]:
    return dict(workload.body["spec"]["template"]["metadata"]["labels"])


def _workloads() -> list[Doc]:
    return [d for kind in WORKLOADS for d in manifests(kind)]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("service", manifests("Service"), ids=lambda d: d.name)
def test_service_selects_a_workload_and_its_named_ports(service: Doc) -> None:
    selector = service.body["spec"]["selector"]
    targets = [w for w in _workloads() if _matches(selector, _pod_labels(w))]
    assert len(targets) == 1, f"Service {service.name} selects {[w.name for w in targets]}"
    ports = {p["name"]: p["containerPort"] for c in targets[0].body["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}
    for port in service.body["spec"]["ports"]:
        target = port["targetPort"]
        assert target in ports, f"Service {service.name}: targetPort {target!r} is not a container port name"
        assert ports[target] == port["port"], f"Service {service.name}: port {port['port']} != container {ports[target]}"


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d.name)
def test_workload_selector_matches_its_pod_labels(workload: Doc) -> None:
    assert _matches(workload.body["spec"]["selector"]["matchLabels"], _pod_labels(workload))


def test_pdb_covers_the_router_and_leaves_room_for_disruption() -> None:
    pdb, router = one("PodDisruptionBudget", "scheduler-router"), one("Deployment", "scheduler-router")
    assert _matches(pdb.body["spec"]["selector"]["matchLabels"], _pod_labels(router))
    replicas = router.body["spec"]["replicas"]
    assert replicas >= 2
    assert 1 <= pdb.body["spec"]["minAvailable"] < replicas


def _generated_configmaps(kustomization: Path) -> dict[str, list[Path]]:
    """ConfigMap name -> the files it carries, over this kustomization and the folders it includes."""
    found: dict[str, list[Path]] = {}
    data = yaml.safe_load(kustomization.read_text())
    for generator in data.get("configMapGenerator", []):
        found[generator["name"]] = [kustomization.parent / f.split("=", 1)[-1] for f in generator["files"]]
    for rel in data.get("resources", []):
        sub = kustomization.parent / rel / "kustomization.yaml"
        if sub.exists():
            found.update(_generated_configmaps(sub))
    return found


@pytest.mark.parametrize("kind,name,folder", [("Deployment", "scheduler-router", "router"),
                                              ("StatefulSet", "redis", "redis")])
def test_mounted_configmaps_are_generated_next_to_the_workload(kind: str, name: str, folder: str) -> None:
    generated = _generated_configmaps(INFRA / folder / "kustomization.yaml")
    volumes = one(kind, name).body["spec"]["template"]["spec"]["volumes"]
    mounted = [v["configMap"]["name"] for v in volumes if "configMap" in v]
    assert mounted
    for config_map in mounted:
        assert config_map in generated, f"{name} mounts ConfigMap {config_map}, which no generator makes"


def test_router_config_maps_hold_a_valid_fleet_with_the_routers_policy() -> None:
    generated = _generated_configmaps(INFRA / "router" / "kustomization.yaml")
    regions = {p.parent for p in generated["scheduler-regions"]}
    policies = {p.parent for p in generated["scheduler-policies"]}
    assert len(regions) == 1 and len(policies) == 1
    fleet = load_fleet(regions.pop(), policies.pop())
    args = container(one("Deployment", "scheduler-router"), "router")["args"]
    policy = next(a.split("=", 1)[1] for a in args if a.startswith("--policy="))
    assert policy in fleet.policies
    for region in fleet.regions:
        assert "127.0.0.1" not in region.endpoint and "localhost" not in region.endpoint, region.name


def test_budgets_file_loads_with_the_routers_parser() -> None:
    budgets = load_budgets(INFRA / "router" / "budgets.yaml")
    assert budgets and all(b.hard_energy_j for b in budgets.values())


def test_redis_persists_the_ledger_and_never_evicts() -> None:
    conf = dict(
        line.split(None, 1) for line in (INFRA / "redis" / "redis.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] in ("everysec", "always")
    assert conf["maxmemory-policy"] == "noeviction"
    redis = one("StatefulSet", "redis")
    assert redis.body["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    mounts = {m["mountPath"]: m["name"] for m in container(redis, "redis")["volumeMounts"]}
    assert mounts[conf["dir"]] == "data", "the AOF directory must be on the PVC"
