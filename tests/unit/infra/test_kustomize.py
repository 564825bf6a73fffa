"""The kustomizations build with the real kustomize (kubectl's), and the generated ConfigMap
names (with their content hashes) are the ones the workloads mount."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.infra.infra_files import INFRA, kustomizations

KUBECTL = shutil.which("kubectl")


def build(folder: Path) -> list[dict[str, object]]:
    # .ci/run installs kubectl (Debian's kubernetes-client) when it is absent: no skip.
    assert KUBECTL is not None, "kubectl is not installed (apt-get install kubernetes-client)"
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if isinstance(d, dict)]


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: str(p.parent.relative_to(INFRA.parent)))
def test_kustomization_builds(path: Path) -> None:
    assert build(path.parent)


@pytest.mark.parametrize("folder", ["router", "overlays/router-tls", "redis"])
def test_workloads_mount_the_generated_config_maps(folder: str) -> None:
    objects = build(INFRA / folder)
    config_maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}  # type: ignore[index]
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    assert workloads
    for workload in workloads:
        volumes = workload["spec"]["template"]["spec"]["volumes"]  # type: ignore[index]
        for volume in volumes:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_tls_overlay_serves_tls_and_probes_plaintext_healthz() -> None:
    (deployment,) = [o for o in build(INFRA / "overlays" / "router-tls") if o["kind"] == "Deployment"]
    (router,) = deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert "--tls-cert=/etc/scheduler/tls/tls.crt" in router["args"]
    assert "--metrics-port=9464" in router["args"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(router[probe]) & {"grpc", "tcpSocket", "httpGet"} == {"httpGet"}, probe
        assert router[probe]["httpGet"] == {"path": "/healthz", "port": 9464}, probe
    assert "/etc/scheduler/tls" in [m["mountPath"] for m in router["volumeMounts"]]


def test_everything_lands_in_one_namespace() -> None:
    objects = build(INFRA)
    kinds = {str(o["kind"]) for o in objects}
    assert {"RayService", "Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "PodMonitor",
            "NetworkPolicy"} <= kinds
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"}  # type: ignore[index]
    assert {"default-deny-ingress", "scheduler-router", "redis", "eu-north-ray"} <= policies
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"llm-scheduler"}  # type: ignore[attr-defined]
