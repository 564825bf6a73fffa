"""The manifests call the code as it is: every router flag exists in ``scheduler``'s argparse
parser, ports and mounted paths agree, and each RayService's Serve config fits Ray's schema
and the region application's options."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli import build_parser
from scheduler.config.loader import default_region, validate
from scheduler.config.schema import RegionConfig
from scheduler.serve.app import EngineOptions
from scheduler.state.factory import OPENERS
from tests.unit.infra.infra_files import INFRA, Doc, container, flag_value, load_render, manifests, one

SAMPLE_REDIS_URL = "redis://:secret@redis.llm-scheduler.svc.cluster.local:6379/0"


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a) for a in args]


def _router_args(overlay: Path | None) -> list[str]:
    base = container(one("Deployment", "scheduler-router"), "router")
    if overlay is None:
        return list(base["args"])
    patch = yaml.safe_load(overlay.read_text())
    patched = next(c for c in patch["spec"]["template"]["spec"]["containers"] if c["name"] == "router")
    return list(patched["args"])


TLS_PATCH = INFRA / "overlays" / "router-tls" / "deployment-tls.yaml"
ROUTER_VARIANTS: dict[str, Path | None] = {"base": None, "tls": TLS_PATCH}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on an unknown flag or a bad value
        raise AssertionError(f"`scheduler {' '.join(argv)}` does not parse (exit {exc.code})") from None


@pytest.mark.parametrize("variant", sorted(ROUTER_VARIANTS))
def test_router_container_args_parse_as_the_router_command(parser: argparse.ArgumentParser, variant: str) -> None:
    deployment = one("Deployment", "scheduler-router")
    router = container(deployment, "router")
    assert router["command"] == ["scheduler"]
    args = _router_args(ROUTER_VARIANTS[variant])
    env_names = {e["name"] for e in router["env"]}
    for var in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert var in env_names, f"args use $({var}), which the container does not define"
    parsed = _parse(parser, _expand(args, {"SCHEDULER_STATE": SAMPLE_REDIS_URL}))
    assert parsed.command == "router"
    assert parsed.handler.__module__ == "scheduler.server.cli"
    assert parsed.state.split(":", 1)[0] in OPENERS, "the state URL scheme has no store opener"
    assert parsed.keys is not None, "production routers authenticate (--keys)"
    assert parsed.budgets is not None
    if variant == "tls":
        assert parsed.tls_cert is not None and parsed.tls_key is not None


def test_tls_overlay_keeps_every_base_flag() -> None:
    base, tls = _router_args(None), _router_args(TLS_PATCH)
    assert [a for a in tls if not a.startswith("--tls-")] == base


@pytest.mark.parametrize("variant", sorted(ROUTER_VARIANTS))
def test_files_the_router_reads_are_mounted(parser: argparse.ArgumentParser, variant: str) -> None:
    router = container(one("Deployment", "scheduler-router"), "router")
    mounts = [m["mountPath"] for m in router["volumeMounts"]]
    if variant == "tls":
        patch = yaml.safe_load(TLS_PATCH.read_text())
        mounts += [m["mountPath"] for c in patch["spec"]["template"]["spec"]["containers"] for m in c["volumeMounts"]]
    parsed = _parse(parser, _expand(_router_args(ROUTER_VARIANTS[variant]), {"SCHEDULER_STATE": SAMPLE_REDIS_URL}))
    paths = [parsed.regions, parsed.policies, parsed.keys, parsed.budgets, parsed.tls_cert, parsed.tls_key]
    for path in (p for p in paths if p is not None):
        assert any(Path(path).is_relative_to(m) for m in mounts), f"{path} is not under a volume mount"
    volumes = {v["name"]: v for v in one("Deployment", "scheduler-router").body["spec"]["template"]["spec"]["volumes"]}
    by_mount = {m["mountPath"]: m["name"] for m in router["volumeMounts"]}
    # The keys file is a secret, not a ConfigMap; the budgets ConfigMap carries the file the flag names.
    assert "secret" in volumes[by_mount[str(parsed.keys.parent)]]
    assert parsed.budgets.name == "budgets.yaml"


def test_router_ports_and_probes_agree_with_the_cli(parser: argparse.ArgumentParser) -> None:
    deployment = one("Deployment", "scheduler-router")
    router = container(deployment, "router")
    parsed = _parse(parser, _expand(list(router["args"]), {"SCHEDULER_STATE": SAMPLE_REDIS_URL}))
    (port,) = [p["containerPort"] for p in router["ports"] if p["name"] == "grpc"]
    assert parsed.port == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert router[probe]["grpc"]["port"] == port, f"{probe} must call grpc.health.v1 on the router's port"
    # In-flight streams get --grace seconds; the pod must outlive them.
    assert deployment.body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > parsed.grace + 5
    service = one("Service", "scheduler-router")
    assert [p["port"] for p in service.body["spec"]["ports"]] == [port]
    flag = flag_value(list(router["args"]), "--port")
    assert flag == str(port)


# --- RayService per region ---------------------------------------------------------------


def _serve_config(doc: Doc) -> dict[str, Any]:
    config = yaml.safe_load(doc.body["spec"]["serveConfigV2"])
    assert isinstance(config, dict)
    return config


RAYSERVICES = manifests("RayService")


def test_one_rayservice_per_region_file() -> None:
    regions = {p.stem for p in (INFRA.parent / "regions").glob("*.yaml")}
    assert {d.name for d in RAYSERVICES} == regions


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_serve_config_fits_rays_schema(doc: Doc) -> None:
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(_serve_config(doc))
    (app,) = schema.applications
    assert app.name == doc.name and app.route_prefix == f"/{doc.name}"


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_serve_args_fit_the_region_application(doc: Doc) -> None:
    (app,) = _serve_config(doc)["applications"]
    args = app["args"]
    region = validate(RegionConfig, default_region(args["region"]), f"{doc.path}: args.region")
    assert region.name == doc.name
    assert args["pool"] in {p.name for p in region.pools}
    fields = {f.name for f in dataclasses.fields(EngineOptions)}
    assert set(args["engine"]) <= fields, f"unknown EngineOptions: {set(args['engine']) - fields}"
    options = EngineOptions(**{**args["engine"], "model_dir": Path(args["engine"]["model_dir"])})
    assert options.device == "gpu"
    # The router reaches the region where its gateway listens: the app's route prefix on Serve's port.
    assert region.endpoint.endswith(app["route_prefix"])
    assert f":{_serve_config(doc)['http_options']['port']}/" in region.endpoint


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_gpu_workers_request_the_gpus_and_the_node_type_of_their_pool(doc: Doc) -> None:
    render = load_render()
    (app,) = _serve_config(doc)["applications"]
    region = validate(RegionConfig, default_region(app["args"]["region"]), str(doc.path))
    pool = next(p for p in region.pools if p.name == app["args"]["pool"])
    (group,) = doc.body["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    spec = group["template"]["spec"]
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == render.GPU_PRODUCT_LABEL[pool.gpu]
    (worker,) = spec["containers"]
    limits, requests = worker["resources"]["limits"], worker["resources"]["requests"]
    assert int(limits["nvidia.com/gpu"]) >= 1 and limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    head = doc.body["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no replicas on the head"
    env = {e["name"] for c in (worker, head["template"]["spec"]["containers"][0]) for e in c["env"]}
    assert "SCHEDULER_STATE" in env


def test_serve_import_path_is_a_ray_application_builder() -> None:
    import importlib

    render = load_render()
    module_name, _, attr = render.APP_BUILDER.partition(":")
    builder = getattr(importlib.import_module(module_name), attr)
    # Ray calls an application builder with exactly one argument: the `args` mapping.
    assert len(inspect.signature(builder).parameters) == 1
    assert all(_serve_config(d)["applications"][0]["import_path"] == render.APP_BUILDER for d in RAYSERVICES)


def test_the_app_builder_rejects_bad_args_naming_the_field() -> None:
    from scheduler.serve.app import region_app_builder

    (service,) = [d for d in RAYSERVICES if _serve_config(d)["applications"][0]["args"]["region"]["name"] == "us-east"]
    args = dict(_serve_config(service)["applications"][0]["args"])
    with pytest.raises(ValueError, match=r"args\.pool: 'h999' is not a pool of region us-east"):
        region_app_builder({**args, "pool": "h999"})
    with pytest.raises(ValueError, match=r"args.engine: unknown keys \['warp'\]"):
        region_app_builder({**args, "engine": {**args["engine"], "warp": 9}})
    with pytest.raises(ValueError, match=r"serveConfigV2 args\.region: pue"):
        region_app_builder({**args, "region": {**args["region"], "pue": "high"}})
