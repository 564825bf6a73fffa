#!/usr/bin/env bash
# On an NVIDIA GPU machine (Volta or newer for NVML's energy counter): install the CUDA build
# of vLLM, then run one region on one GPU, send it real requests (one alone, then eight
# together), and print what NVML measured: the counter's update period, the GPUs the replica
# claims, every meter interval's measured / attributed / idle joules (rule
# predicted-share-v1 conserves them), each request's bill with its interval and batch.
# Cannot run on CPU-only machines (exit 2 there).  Usage: scripts/gpu_check.sh [VENV]
set -euo pipefail
venv=${1:-.venv-gpu}
here=$(cd "$(dirname "$0")/.." && pwd)
nvidia-smi --query-gpu=name,driver_version,power.draw --format=csv,noheader || { echo "no NVIDIA driver" >&2; exit 2; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -e "$here[gpu]"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
exec "$venv/bin/python" -m scheduler.region.gpu_check
