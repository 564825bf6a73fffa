"""The manifests call the code as it is: every router flag exists in ``scheduler``'s argparse
parser, ports and mounted paths agree, and each RayService's Serve config fits Ray's schema
and the region application's options."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli import build_parser
from scheduler.config.loader import default_region, validate
from scheduler.config.schema import RegionConfig
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
    # The router reads the store URL from its environment, as the container sets it.
    assert parsed.state is None and parsed.state_file is None
    assert "SCHEDULER_STATE" in env_names
    assert SAMPLE_REDIS_URL.split(":", 1)[0] in OPENERS, "the state URL scheme has no store opener"
    assert parsed.keys is not None and not parsed.insecure, "production routers authenticate (--keys)"
    assert parsed.config_trust is not None and not parsed.config_allow_unsigned, "production routers check signatures"
    assert parsed.ticket_keys is not None and not parsed.insecure_no_tickets, "production routers sign dispatches"
    assert parsed.budgets is not None
    if variant == "tls":
        assert parsed.tls_cert is not None and parsed.tls_key is not None


@pytest.mark.parametrize("variant", sorted(ROUTER_VARIANTS))
def test_no_secret_reaches_the_routers_arguments(variant: str) -> None:
    """``ps`` shows every process's arguments: Kubernetes' $(VAR) expansion must not put a
    secret there (the router reads $SCHEDULER_STATE itself)."""
    router = container(one("Deployment", "scheduler-router"), "router")
    from_secrets = {e["name"] for e in router["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert "SCHEDULER_STATE" in from_secrets
    args = _router_args(ROUTER_VARIANTS[variant])
    used = set(re.findall(r"\$\((\w+)\)", " ".join(args)))
    assert not used & from_secrets, f"args expand secret variables {used & from_secrets}"
    argv = ["scheduler", *_expand(args, {"SCHEDULER_STATE": SAMPLE_REDIS_URL})]
    assert not any("secret" in a or "redis://" in a for a in argv), argv


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
    paths = [parsed.regions, parsed.policies, parsed.keys, parsed.ticket_keys, parsed.budgets, parsed.tls_cert,
             parsed.tls_key, parsed.config_trust, parsed.config_signature]
    for path in (p for p in paths if p is not None):
        assert any(Path(path).is_relative_to(m) for m in mounts), f"{path} is not under a volume mount"
    volumes = {v["name"]: v for v in one("Deployment", "scheduler-router").body["spec"]["template"]["spec"]["volumes"]}
    by_mount = {m["mountPath"]: m["name"] for m in router["volumeMounts"]}
    # The keys file is a secret, not a ConfigMap; the budgets ConfigMap carries the file the flag names.
    assert "secret" in volumes[by_mount[str(parsed.keys.parent)]]
    # Every region's ticket keys (docs/security.md), from their own secret.
    tickets = volumes[by_mount[str(parsed.ticket_keys.parent)]]
    assert tickets["secret"]["secretName"] == "scheduler-tickets-router"
    assert parsed.ticket_keys.name in {i["path"] for i in tickets["secret"]["items"]}
    assert parsed.budgets.name == "budgets.yaml"
    # The keys whose signatures make a config version adoptable, guarded as a secret; the
    # signature of the mounted files is optional (versions also come from `config publish`).
    trust = volumes[by_mount[str(parsed.config_trust.parent)]]
    assert trust["secret"]["secretName"] == "scheduler-config-trust"
    assert parsed.config_trust.name in {i["path"] for i in trust["secret"]["items"]}
    assert volumes[by_mount[str(parsed.config_signature.parent)]]["secret"]["optional"] is True


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
    (http_port,) = [p["containerPort"] for p in router["ports"] if p["name"] == "http"]
    assert parsed.http_port == http_port and parsed.http_host == "0.0.0.0"
    service = one("Service", "scheduler-router")
    assert [(p["port"], p["targetPort"]) for p in service.body["spec"]["ports"]] == [(port, "grpc"), (http_port, "http")]
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


def _region(doc: Doc) -> RegionConfig:
    (app,) = _serve_config(doc)["applications"]
    return validate(RegionConfig, default_region(app["args"]["region"]), f"{doc.path}: args.region")


POOL_KEYS = {"device", "model_dir", "served_model", "max_model_len", "max_num_seqs", "gpu_memory_utilization",
             "enforce_eager", "tensor_parallel", "autoscaling", "accelerator_type"}


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_serve_args_have_one_deployment_per_model_of_each_pool(doc: Doc) -> None:
    render = load_render()
    (app,) = _serve_config(doc)["applications"]
    args = app["args"]
    assert set(args) == {"region", "namespace", "tickets", "pools"}
    assert "local" not in args["region"], "production serves every pool: no local profile in the args"
    region = _region(doc)
    assert region.name == doc.name
    assert args["tickets"] == "required"
    assert args["namespace"] == render.default_options().key_namespace
    assert list(args["pools"]) == [p.name for p in region.pools]
    for pool in region.pools:
        entries = args["pools"][pool.name]
        # Every model the pool declares, each in a deployment of its own, in the file's order.
        assert [entry["served_model"] for entry in entries] == [m.name for m in pool.models]
        for entry, model in zip(entries, pool.models, strict=True):
            assert set(entry) == POOL_KEYS, pool.name
            assert entry["device"] == "gpu"
            assert entry["model_dir"] == f"/models/{model.name}"
            assert entry["max_model_len"] == model.max_context
            assert entry["tensor_parallel"] == model.tensor_parallel
            assert entry["accelerator_type"] == render.RAY_ACCELERATOR_TYPE[pool.gpu]
            scaling = entry["autoscaling"]
            assert 0 <= scaling["min_replicas"] <= scaling["max_replicas"]
            assert scaling["max_replicas"] >= 1
        # The models at their most take no more GPUs than the pool declares.
        assert sum(e["autoscaling"]["max_replicas"] * e["tensor_parallel"] for e in entries) <= pool.count
    # The router reaches the region where its gateway listens: the app's route prefix on Serve's port.
    assert region.endpoint.endswith(app["route_prefix"])
    assert f":{_serve_config(doc)['http_options']['port']}/" in region.endpoint


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_one_gpu_worker_group_per_pool_advertising_its_accelerator(doc: Doc) -> None:
    from ray.autoscaler._private.kuberay.autoscaling_config import _get_ray_resources_from_group_spec

    render = load_render()
    (app,) = _serve_config(doc)["applications"]
    region = _region(doc)
    groups = {g["groupName"]: g for g in doc.body["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert list(groups) == [f"gpu-{p.name}" for p in region.pools]
    for pool in region.pools:
        group, entries = groups[f"gpu-{pool.name}"], app["args"]["pools"][pool.name]
        spec = group["template"]["spec"]
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == render.GPU_PRODUCT_LABEL[pool.gpu]
        assert group["template"]["metadata"]["labels"]["scheduler/pool"] == pool.name
        (worker,) = spec["containers"]
        limits, requests = worker["resources"]["limits"], worker["resources"]["requests"]
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"]
        gpus = int(limits["nvidia.com/gpu"])
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        # The group keeps at least the GPUs of the models' min_replicas.
        assert group["minReplicas"] * gpus >= sum(e["autoscaling"]["min_replicas"] * e["tensor_parallel"]
                                                  for e in entries)
        for entry in entries:
            assert gpus >= entry["tensor_parallel"], "a replica's tensor-parallel GPUs sit on one worker"
            # Every replica fits on the group at its largest.
            assert group["maxReplicas"] * (gpus // entry["tensor_parallel"]) >= entry["autoscaling"]["max_replicas"]
        # The group is no larger than the pool.
        assert (group["maxReplicas"] - 1) * gpus < pool.count
        # What the KubeRay autoscaler believes a worker of this group offers, before one exists:
        # the GPUs and the accelerator type the pool's deployments ask for.
        offered = _get_ray_resources_from_group_spec(group, is_head=False)
        assert offered["GPU"] == gpus
        for entry in entries:
            assert offered.get(f"accelerator_type:{entry['accelerator_type']}") == 1, offered
    head = doc.body["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no replicas on the head"
    assert not any(k.startswith("accelerator_type:") for k in _get_ray_resources_from_group_spec(head, is_head=True))


def test_accelerator_types_are_rays_names_for_every_catalogue_gpu() -> None:
    import ray.util.accelerators.accelerators as accelerators

    from scheduler.energy.hardware import GPU_CATALOGUE

    rays = {v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}
    mapping = load_render().RAY_ACCELERATOR_TYPE
    assert set(mapping) == set(GPU_CATALOGUE)
    assert set(mapping.values()) <= rays, set(mapping.values()) - rays
    assert mapping["A100-80GB"] == "A100-80G" and mapping["H200-141GB"] == "H200"


def test_a_pool_whose_model_spans_nodes_is_refused() -> None:
    render = load_render()
    (doc,) = [d for d in RAYSERVICES if d.name == "eu-north"]
    region = _region(doc)
    pool = region.pools[0]
    wide = pool.model_copy(update={"models": tuple(m.model_copy(update={"tensor_parallel": 16}) for m in pool.models),
                                   "count": 32})
    with pytest.raises(ValueError, match=r"tensor_parallel=16 GPUs on one node"):
        render.pool_plan(region, wide, render.default_options())


def test_serve_import_path_is_a_ray_application_builder() -> None:
    import importlib

    render = load_render()
    module_name, _, attr = render.APP_BUILDER.partition(":")
    builder = getattr(importlib.import_module(module_name), attr)
    # Ray calls an application builder with exactly one argument: the `args` mapping.
    assert len(inspect.signature(builder).parameters) == 1
    assert all(_serve_config(d)["applications"][0]["import_path"] == render.APP_BUILDER for d in RAYSERVICES)


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_pool_entries_are_the_builders_engine_options(doc: Doc) -> None:
    # Depends on scheduler.region.app: each args.pools entry is EngineOptions fields.
    from scheduler.region.app import EngineOptions

    fields = set(EngineOptions.__dataclass_fields__)
    for name, entries in _serve_config(doc)["applications"][0]["args"]["pools"].items():
        for entry in entries:
            assert set(entry) <= fields, f"{name}: unknown EngineOptions {set(entry) - fields}"
            options = EngineOptions(**{**entry, "model_dir": Path(entry["model_dir"])})
            assert options.device == "gpu" and options.accelerator_type == entry["accelerator_type"]


def test_the_app_builder_rejects_bad_args_naming_the_field() -> None:
    # Depends on scheduler.region.app.region_app_builder's validation of the `pools` shape.
    from scheduler.region.app import region_app_builder

    (service,) = [d for d in RAYSERVICES if _serve_config(d)["applications"][0]["args"]["region"]["name"] == "us-east"]
    args = dict(_serve_config(service)["applications"][0]["args"])
    first = next(iter(args["pools"]))
    with pytest.raises(ValueError, match=r"args\.pools\.h999: not a pool of region us-east"):
        region_app_builder({**args, "pools": {**args["pools"], "h999": args["pools"][first]}})
    entries = args["pools"][first]
    with pytest.raises(ValueError, match=rf"args\.pools\.{first}\[1\]: unknown keys \['warp'\]"):
        region_app_builder({**args, "pools": {first: [entries[0], {**entries[1], "warp": 9}, *entries[2:]]}})
    with pytest.raises(ValueError, match=rf"args\.pools\.{first}: expected a list of engine options"):
        region_app_builder({**args, "pools": {first: entries[0]}})
    # Every model the pool declares is served: a pool's list without one of them is refused.
    left_out = entries[-1]["served_model"]
    with pytest.raises(ValueError, match=rf"args\.pools: region us-east: pool {first}: .* not served: {left_out}"):
        region_app_builder({**args, "pools": {first: entries[:-1]}})
    # The deployments at their most may not take more GPUs than the pool has.
    region = validate(RegionConfig, default_region(args["region"]), "args.region")
    count = next(p.count for p in region.pools if p.name == first)
    wide = [{**entries[0], "autoscaling": {**entries[0]["autoscaling"], "max_replicas": count}}, *entries[1:]]
    with pytest.raises(ValueError, match=rf"pool {first}: autoscaling\.max_replicas x tensor_parallel sums to "
                                         rf"\d+ GPUs \({entries[0]['served_model']}: {count} x 1, .*\) but the pool "
                                         rf"has count={count}"):
        region_app_builder({**args, "pools": {first: wide}})
    with pytest.raises(ValueError, match=r"args\.tickets"):
        region_app_builder({**args, "tickets": "optional"})
    with pytest.raises(ValueError, match=r"serveConfigV2 args\.region: pue"):
        region_app_builder({**args, "region": {**args["region"], "pue": "high"}})
