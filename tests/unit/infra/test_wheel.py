"""The wheel built from this checkout works with no checkout: installed into a new virtualenv
(offline: --no-deps, the light dependencies seen from this one's site-packages through a path
entry, never this checkout), run from an empty folder, `scheduler init`, `config validate` and
`route --explain` work on the configs it carries, and its metadata says what users' tools read."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from scheduler import __version__, exit_codes

PROJECT = Path(__file__).resolve().parents[3]
# What the wheel is built from: the rest of the checkout is not packaged.
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "scheduler", "regions", "policies"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy (setuptools builds in the source tree and leaves build/ there, whose
    stale files would go into the next wheel)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        if (PROJECT / name).is_dir():
            shutil.copytree(PROJECT / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(PROJECT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", str(work / "dist"), str(source)],
                   env=_offline_env(), check=True, timeout=120, capture_output=True)
    (built,) = (work / "dist").glob("carbon_scheduler-*.whl")
    return built


def _offline_env(**extra: str) -> dict[str, str]:
    # No PYTHONPATH (it names this checkout) and no pip settings from this machine.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1",
            **extra}


@pytest.mark.timeout(60)
def test_the_wheel_carries_the_configs_and_says_its_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(archive.read(info).decode())
    for kind in ("regions", "policies"):
        assert {f"scheduler/examples/{kind}/{p.name}" for p in (PROJECT / kind).glob("*.yaml")} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.11"
    assert "vllm==0.32.0; extra == \"gpu\"" in meta.get_all("Requires-Dist")
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        scripts = archive.read(entry_points).decode()
    assert "scheduler = scheduler.cli:main" in scripts and "carbon-scheduler = scheduler.cli:main" in scripts


@pytest.mark.timeout(120)
def test_the_installed_wheel_runs_the_readme_commands_without_a_checkout(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    target = Path(subprocess.run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True, timeout=30).stdout.strip())
    # The light dependencies (and pip) from this virtualenv, as a path entry: its .pth files,
    # among them the editable install of the checkout, are not read from there.
    (target / "light_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _offline_env()
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   env=env, check=True, timeout=60, capture_output=True)
    work = tmp_path / "elsewhere"  # no regions/ or policies/ here
    work.mkdir()

    def scheduler(*argv: str, command: str = "scheduler") -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_dir / command), *argv], cwd=work, env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    where = subprocess.run([bin_dir / "python", "-c", "import scheduler; print(scheduler.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True, check=True, timeout=30).stdout
    assert Path(where).is_relative_to(target), where  # the wheel's copy, not the checkout

    version = scheduler("--version", command="carbon-scheduler")
    assert (version.returncode, version.stdout.strip()) == (0, f"carbon-scheduler {__version__}")

    shipped = scheduler("config", "validate")
    assert shipped.returncode == exit_codes.OK, shipped.stderr
    assert shipped.stdout.startswith("ok: 8 regions") and str(target / "scheduler" / "examples") in shipped.stdout
    assert "using the example regions and policies shipped with the package" in shipped.stderr

    init = scheduler("init", "fleet")
    assert init.returncode == exit_codes.OK, init.stderr
    validated = scheduler("config", "validate", "--regions", "fleet/regions", "--policies", "fleet/policies")
    assert validated.returncode == exit_codes.OK, validated.stderr
    assert "in fleet/regions" in validated.stdout and validated.stderr == ""

    route = scheduler("route", "--explain", "--prompt-tokens", "100000", "--regions", "fleet/regions",
                      "--policies", "fleet/policies")
    assert route.returncode == exit_codes.OK, route.stderr
    assert route.stdout.startswith("chosen   ") and "H200-141GB" in route.stdout.splitlines()[0]

    (work / "fleet" / "policies" / "default.yaml").write_text("scorers: soon\n")
    broken = scheduler("route", "--explain", "--regions", "fleet/regions", "--policies", "fleet/policies")
    assert broken.returncode == exit_codes.CONFIG and "fleet/policies/default.yaml" in broken.stderr
