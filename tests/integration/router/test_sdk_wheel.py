"""The SDK alone (``carbon-scheduler-sdk``, sdk/pyproject.toml): its wheel, installed into new
virtualenvs on Python 3.11, 3.12 and 3.13 with nothing but its own dependencies, imports without
any of the router's and streams answers from a real router (this process's, on port 0, over stub
regions): over gRPC with a receipt, over the HTTP front door with the async client (httptools),
and in direct mode from the region itself (httpx, the dispatch tickets).

The dependencies come through pip with this machine's settings (PyPI or its mirror): grpcio's,
orjson's and httptools' wheels differ per Python version. A missing interpreter fails the test
with what to install: the SDK's supported versions are tested, not skipped."""

from __future__ import annotations

import asyncio
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from scheduler.tickets import TicketKeyRing

from .conftest import TEST_REGIONS, Fleet, Keys, RouterFactory

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[3]
PYTHONS = ("3.11", "3.12", "3.13")
# What the SDK may pull in (docs/installing.md says why each): anything more needs a reason there.
SDK_REQUIRES = {"grpcio", "protobuf", "googleapis-common-protos", "httpx", "httptools", "orjson"}
# The router's dependencies, and its own modules: none may be importable beside the SDK alone.
ROUTER_MODULES = ("numpy", "redis", "pydantic", "uvloop", "yaml", "pynvml", "opentelemetry", "cryptography",
                  "scheduler.server", "scheduler.config", "scheduler.types")

# Run by the virtualenv's Python, isolated (-I: no PYTHONPATH, no user site, not the checkout).
SCRIPT = """
import asyncio, importlib.util, json, sys
present = [name for name in sys.argv[4].split(",") if importlib.util.find_spec(name) is not None]
import scheduler
from scheduler.client import AsyncSchedulerClient, SchedulerClient
target, http_url, key = sys.argv[1:4]
with SchedulerClient(target, api_key=key) as client:
    grpc_proxy = client.generate("Hello", model="llama-3.1-8b", max_tokens=3)
    grpc_text = grpc_proxy.text()
with SchedulerClient(target, api_key=key, http_url=http_url) as client:
    direct_text = client.generate("Hello", model="llama-3.1-8b", max_tokens=2, mode="direct").text()

async def over_http():
    async with AsyncSchedulerClient(target, api_key=key, http_url=http_url) as client:
        generation = client.generate("Hello", model="llama-3.1-8b", max_tokens=1)
        return await generation.text(), generation.receipt.HasField("energy_j")

http_text, http_receipt = asyncio.run(over_http())
receipt = grpc_proxy.receipt
print(json.dumps({
    "python": list(sys.version_info[:2]), "present": present, "scheduler": scheduler.__file__,
    "grpc_text": grpc_text, "direct_text": direct_text, "http_text": http_text, "http_receipt": http_receipt,
    "energy_j": receipt.energy_j if receipt.HasField("energy_j") else None,
    "receipt_region": receipt.region, "chosen_region": grpc_proxy.decision.ranked[0].region,
}))
"""


def _clean_env() -> dict[str, str]:
    # No PYTHONPATH (it names this checkout); pip keeps this machine's index settings.
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONNOUSERSITE": "1"}


@pytest.fixture(scope="module")
def sdk_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once, from a copy of sdk/ with its links resolved (setuptools leaves build/ in the
    tree it builds, whose stale files would go into the next wheel)."""
    work = tmp_path_factory.mktemp("sdk-wheel")
    shutil.copytree(PROJECT / "sdk", work / "source", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(work / "dist"), str(work / "source")],
                   env={**_clean_env(), "PIP_CONFIG_FILE": os.devnull}, check=True, timeout=120, capture_output=True)
    (built,) = (work / "dist").glob("carbon_scheduler_sdk-*.whl")
    return built


def interpreter(version: str) -> Path:
    """A Python ``version``: pyenv's build of it, else ``python{version}`` on PATH."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [*pyenv.glob(f"versions/{version}.*/bin/python{version}"), shutil.which(f"python{version}")]
    for candidate in candidates:
        if candidate is None:
            continue
        probe = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return Path(candidate)
    pytest.fail(f"the SDK is tested on Python {version}, and none was found (looked in {pyenv}/versions and for "
                f"python{version} on PATH): install it, e.g. `pyenv install {version}`")


@pytest.fixture(scope="module", params=PYTHONS)
def sdk_python(request: pytest.FixtureRequest, sdk_wheel: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(the version, the Python of) a new virtualenv with the SDK's wheel and its dependencies only: made without pip (this
    process's pip installs into it, which is quicker than bootstrapping one per virtualenv)."""
    version: str = request.param
    venv = tmp_path_factory.mktemp(f"sdk-py{version}")
    subprocess.run([str(interpreter(version)), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=60, capture_output=True)
    python = venv / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                                str(sdk_wheel)], env=_clean_env(), timeout=300, capture_output=True, text=True)
    assert installed.returncode == 0, f"pip could not install the SDK on Python {version}:\n{installed.stderr}"
    return version, python


@pytest.mark.timeout(30)
def test_the_wheel_requires_only_the_sdks_dependencies_and_python_3_11(sdk_wheel: Path) -> None:
    with zipfile.ZipFile(sdk_wheel) as archive:
        names = archive.namelist()
        meta = email.parser.Parser().parsestr(archive.read(next(n for n in names if n.endswith("/METADATA"))).decode())
    requires = {re.split(r"[<>=!~ ;\[]", line, maxsplit=1)[0].lower() for line in meta.get_all("Requires-Dist", [])}
    assert requires == SDK_REQUIRES
    assert meta["Name"] == "carbon-scheduler-sdk" and meta["Requires-Python"] == ">=3.11"
    packages = {n.rsplit("/", 1)[0] for n in names if n.startswith("scheduler/") and n.endswith(".py")}
    assert packages == {"scheduler", "scheduler/client", "scheduler/v1", "scheduler/wire", "scheduler/http",
                        "scheduler/energy"}


@pytest.mark.timeout(120)
async def test_the_sdk_alone_streams_from_a_router(
    sdk_python: tuple[str, Path], stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, tmp_path: Path,
) -> None:
    version, python = sdk_python
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True,
                               ticket_keys=TicketKeyRing.generate(TEST_REGIONS))
    # Run as its own process while this one's event loop serves the router.
    process = await asyncio.create_subprocess_exec(
        str(python), "-I", "-c", SCRIPT, f"127.0.0.1:{router.port}", f"http://127.0.0.1:{router.http_port}",
        keys.tenant.key, ",".join(ROUTER_MODULES),
        cwd=tmp_path, env=_clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, stderr.decode()
    seen: dict[str, Any] = json.loads(stdout)
    assert ".".join(map(str, seen["python"])) == version
    assert seen["present"] == [], f"beside the SDK alone, these import: {seen['present']}"
    assert Path(seen["scheduler"]).is_relative_to(python.parent.parent), seen["scheduler"]
    assert seen["grpc_text"] == "lorem ipsum dolor "
    assert seen["energy_j"] is not None and seen["energy_j"] > 0
    assert seen["receipt_region"] == seen["chosen_region"] in TEST_REGIONS
    assert seen["direct_text"] == "lorem ipsum "
    assert seen["http_text"] == "lorem " and seen["http_receipt"] is True
