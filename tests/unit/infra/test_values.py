"""Values files drive the manifests: infra/values.yaml is what the base was written with, and
`infra/render.py --values FILE` renders a kustomize overlay that the real kustomize
(`kubectl kustomize`) builds, with every value where the cluster reads it and no default left."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.infra.infra_files import INFRA, REPO, kustomizations, load_render
from tests.unit.infra.test_kustomize import build

EXAMPLE = INFRA / "overlays" / "example" / "values.yaml"
# The monitoring ConfigMaps carry alert texts and a dashboard, not references.
MONITORING_CONFIG_MAPS = {"scheduler-alert-rules", "scheduler-grafana-dashboard"}

# Every value changed (and the router terminating TLS).
EVERYTHING = {
    "namespace": "inference",
    "key_namespace": "fleet-b",
    "images": {"router": "reg.internal:5000/llm/router:1.2.3", "region": "reg.internal:5000/llm/region@sha256:" + "a" * 64,
               "redis": "reg.internal:5000/mirror/redis:7.4.2", "redis_exporter": "reg.internal:5000/mirror/exporter:v2"},
    "endpoints": {"template": "https://{region}.gw.{namespace}.example.net/{region}",
                  "regions": {"us-east": "https://us-east.other-cluster.example.net/us-east"},
                  "gateway_cidrs": ["10.30.0.0/16"]},
    "model_volume": {"claim": "weights-ro", "mount_path": "/mnt/weights"},
    "secrets": {"redis_router": "s-redis-router", "redis_region": "s-redis-region", "redis_acl": "s-redis-acl",
                "router_keys": "s-router-keys", "router_tickets": "s-tickets-router",
                "region_tickets": "s-tickets-{region}", "config_trust": "s-trust", "config_signature": "s-sig",
                "carbon_providers": "s-carbon", "router_tls": "s-tls"},
    "router_tls": True,
}


def build_overlay(folder: Path, values: dict[str, Any] | Path) -> list[dict[str, Any]]:
    """Write ``values`` into ``folder``, render its overlay there and build it with kubectl."""
    render = load_render()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "values.yaml"
    if isinstance(values, Path):
        shutil.copyfile(values, target)
    else:
        target.write_text(yaml.safe_dump(values))
    assert render.main(["--values", str(target)]) == 0
    assert render.main(["--check", "--values", str(target)]) == 0
    return build(folder)


@dataclass(frozen=True)
class Reference:
    kind: str  # image | secret | claim | namespace
    value: str
    where: str


def _secret_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "secretName" or (key in ("secretKeyRef", "secretRef") and isinstance(value, dict)):
                yield value if key == "secretName" else value["name"]
            yield from _secret_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _secret_names(item)


def _walk(node: Any, key: str) -> Iterator[Any]:
    if isinstance(node, dict):
        for k, value in node.items():
            if k == key:
                yield value
            yield from _walk(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, key)


def references(objects: list[dict[str, Any]]) -> list[Reference]:
    """Every image, Secret, PVC and namespace the built objects name."""
    found = []
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] != "Namespace":
            found.append(Reference("namespace", obj["metadata"].get("namespace", ""), where))
        found += [Reference("image", image, where) for image in _walk(obj, "image")]
        found += [Reference("secret", name, where) for name in _secret_names(obj)]
        found += [Reference("claim", claim, where) for claim in _walk(obj, "claimName")]
    return found


def _router_regions(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("scheduler-regions")]
    return {name.removesuffix(".yaml"): yaml.safe_load(text) for name, text in config_map["data"].items()}


def _serve_args(rayservice: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    return dict(app["args"])


@pytest.mark.timeout(120)
def test_an_overlay_changing_every_value_leaves_no_default_behind(tmp_path: Path) -> None:
    objects = build_overlay(tmp_path / "prod", EVERYTHING)
    refs = references(objects)
    images = EVERYTHING["images"]
    secrets = EVERYTHING["secrets"]
    regions = sorted(p.stem for p in (REPO / "regions").glob("*.yaml"))
    assert {r.value for r in refs if r.kind == "namespace"} == {"inference"}
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"} == {"inference"}
    assert {r.value for r in refs if r.kind == "image"} == set(images.values())
    assert {r.value for r in refs if r.kind == "claim"} == {"weights-ro"}
    expected_secrets = {v for k, v in secrets.items() if k != "region_tickets"} | {
        f"s-tickets-{region}" for region in regions}
    assert {r.value for r in refs if r.kind == "secret"} == expected_secrets
    by_image = {r.where for r in refs if r.value == images["region"]}
    assert by_image == {f"RayService/{region}" for region in regions}

    endpoints = {name: region["endpoint"] for name, region in _router_regions(objects).items()}
    assert endpoints == {name: ("https://us-east.other-cluster.example.net/us-east" if name == "us-east"
                                else f"https://{name}.gw.inference.example.net/{name}") for name in regions}
    for rayservice in (o for o in objects if o["kind"] == "RayService"):
        args = _serve_args(rayservice)
        assert args["region"]["endpoint"] == endpoints[rayservice["metadata"]["name"]]
        assert args["namespace"] == "fleet-b"
        assert all(entry["model_dir"].startswith("/mnt/weights/")
                   for entries in args["pools"].values() for entry in entries)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-ray")]
    assert policies and all({"ipBlock": {"cidr": "10.30.0.0/16"}} in rule.get("from", [])
                            for p in policies for rule in p["spec"]["ingress"][-1:])

    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (router,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--tls-cert=/etc/scheduler/tls/tls.crt" in router["args"]
    assert [a for a in router["args"] if a.startswith("--namespace")] == ["--namespace=fleet-b"]
    # The Redis users reach the fleet-b keys, and only those.
    (acl,) = [o["data"]["users.acl"] for o in objects
              if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("redis-config")]
    assert "~sched:fleet-b:*" in acl and "%W~sched:fleet-b:ticket:*" in acl and "sched:prod:" not in acl
    (redis,) = [o for o in objects if o["kind"] == "StatefulSet"]
    assert {v["configMap"]["name"] for v in redis["spec"]["template"]["spec"]["volumes"] if "configMap" in v} <= {
        o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    # The router's and the regions' Redis users stay apart under the new names.
    assert {"name": "SCHEDULER_STATE", "valueFrom": {"secretKeyRef": {"name": "s-redis-router", "key": "url"}}} in router["env"]
    mounted = {v["configMap"]["name"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert mounted <= {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}


@pytest.mark.timeout(120)
def test_the_example_overlay_builds_and_keeps_what_it_does_not_set(tmp_path: Path) -> None:
    objects = build_overlay(tmp_path / "example", EXAMPLE)
    example = yaml.safe_load(EXAMPLE.read_text())
    base = load_render().load_values(INFRA / "values.yaml")
    refs = references(objects)
    assert {r.value for r in refs if r.kind == "namespace"} == {example["namespace"]}
    images = {r.value for r in refs if r.kind == "image"}
    assert images == {example["images"]["router"], example["images"]["region"], base.images.redis,
                      base.images.redis_exporter}
    secrets = {r.value for r in refs if r.kind == "secret"}
    assert example["secrets"]["redis_router"] in secrets and base.secrets.redis_router not in secrets
    assert base.secrets.router_keys in secrets  # not set by the example: the base's name
    assert _router_regions(objects)["eu-north"]["endpoint"] == example["endpoints"]["regions"]["eu-north"]
    assert _router_regions(objects)["us-east"]["endpoint"] == (
        f"http://us-east-serve-svc.{example['namespace']}.svc.cluster.local:8000/us-east")


def test_the_base_manifests_carry_infra_values() -> None:
    """The overlay patches the base by the names infra/values.yaml gives: they must be the base's."""
    values = load_render().load_values(INFRA / "values.yaml")
    objects = build(INFRA)
    refs = references(objects)
    assert {r.value for r in refs if r.kind == "namespace"} == {values.namespace}
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"} == {values.namespace}
    assert {r.value for r in refs if r.kind == "image"} == {
        values.images.router, values.images.region, values.images.redis, values.images.redis_exporter}
    assert {r.value for r in refs if r.kind == "claim"} == {values.model_volume.claim}
    regions = sorted(p.stem for p in (REPO / "regions").glob("*.yaml"))
    named = {v for k, v in values.secrets.model_dump().items() if k not in ("region_tickets", "router_tls")}
    assert {r.value for r in refs if r.kind == "secret"} == named | {
        values.secrets.region_tickets.format(region=r) for r in regions}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (router,) = deployment["spec"]["template"]["spec"]["containers"]
    assert f"--namespace={values.key_namespace}" in router["args"]
    assert f"~sched:{values.key_namespace}:*" in (INFRA / "redis" / "users.acl").read_text()
    tls = references(build(INFRA / "overlays" / "router-tls"))
    assert values.secrets.router_tls in {r.value for r in tls if r.kind == "secret"}
    namespaced = [yaml.safe_load(p.read_text()).get("namespace") for p in kustomizations()]
    assert {n for n in namespaced if n} == {values.namespace}


@dataclass(frozen=True)
class Bad:
    name: str
    values: dict[str, Any]
    field: str
    value: str


BAD = [
    Bad("unknown key", {"namespce": "x"}, "namespce", "'x'"),
    Bad("namespace not a DNS label", {"namespace": "LLM_prod"}, "namespace", "'LLM_prod'"),
    Bad("key namespace that globs", {"key_namespace": "prod*"}, "key_namespace", "'prod*'"),
    Bad("placeholder router image", {"images": {"region": "r/region:1"}}, "images.router",
        "'ghcr.io/example/carbon-scheduler-router:0.1.0'"),
    Bad("template without {region}", {"endpoints": {"template": "http://gw:8000/"}}, "endpoints.template",
        "'http://gw:8000/'"),
    Bad("unknown region override", {"endpoints": {"regions": {"mars-1": "https://m/mars-1"}}},
        "endpoints.regions", "'mars-1'"),
    Bad("bad CIDR", {"endpoints": {"gateway_cidrs": ["10.0.0.0/33"]}}, "endpoints.gateway_cidrs", "'10.0.0.0/33'"),
    Bad("relative mount path", {"model_volume": {"mount_path": "models"}}, "model_volume.mount_path", "'models'"),
    Bad("region tickets without {region}", {"secrets": {"region_tickets": "tickets"}}, "secrets.region_tickets",
        "'tickets'"),
    Bad("secret name with capitals", {"secrets": {"router_keys": "Keys"}}, "secrets.router_keys", "'Keys'"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_a_bad_values_file_names_the_file_the_field_and_the_value(tmp_path: Path, case: Bad,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    render = load_render()
    images = {"router": "r/router:1", "region": "r/region:1"}
    values = {"images": images, **case.values} if "images" not in case.values else case.values
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert render.main(["--values", str(path)]) == 4
    problems = capsys.readouterr().err.splitlines()
    assert any(p.startswith(f"{path}: {case.field}") and case.value in p for p in problems), problems
    assert not (tmp_path / "kustomization.yaml").exists()


def test_check_finds_an_overlay_its_values_no_longer_match(tmp_path: Path) -> None:
    render = load_render()
    values = {"images": {"router": "r/router:1", "region": "r/region:1"}}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert render.main(["--values", str(path)]) == 0
    assert render.main(["--check", "--values", str(path)]) == 0
    path.write_text(yaml.safe_dump({**values, "model_volume": {"claim": "other"}}))
    assert render.main(["--check", "--values", str(path)]) == 1
    orphan = tmp_path / "kuberay" / "regions" / "gone.yaml"
    orphan.write_text("{}\n")
    path.write_text(yaml.safe_dump({**values, "key_namespace": "other"}))
    assert render.main(["--values", str(path)]) == 0
    assert not orphan.exists() and (tmp_path / "redis" / "users.acl").exists()
    # Back to the base's key namespace: the overlay's ACL copy goes.
    path.write_text(yaml.safe_dump(values))
    assert render.main(["--values", str(path)]) == 0
    assert not (tmp_path / "redis" / "users.acl").exists()
