"""``python -m scheduler.serve.gpu_check``: on an NVIDIA machine, one region on one GPU (the
CUDA build of vLLM, ``pip install -e '.[gpu]'``), one real request straight to its gateway,
and the joules NVML measured: the node's GPU energy over the request window, and the share
the gateway billed the request in its ``energy`` object (``measurement_source: nvml``).

Exit status 0 when the request was measured by NVML, 2 without a usable GPU, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from scheduler.energy.nvml import NvmlMeter, delta_mj
from scheduler.serve.stack import LocalStack, StackOptions

REGION = "us-east"
PROMPT = "Explain, step by step, how the grid's carbon intensity changes through the day. " * 20


async def _check(meter: NvmlMeter) -> int:
    stack = LocalStack(StackOptions(only=(REGION,), state_url="memory", dashboard=False, http_port=0,
                                    device="gpu", carbon=False), say=print)
    await stack.start()
    try:
        body = {"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": 1024, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        final: dict[str, object] = {}
        before, started = meter.read(), time.monotonic()
        async with httpx.AsyncClient(timeout=120) as client, client.stream(
            "POST", f"{stack.endpoint(REGION)}/v1/completions", json=body
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"energy"' in line:
                    final = json.loads(line[6:])
        after, elapsed = meter.read(), time.monotonic() - started
    finally:
        await stack.stop()
    if before is None or after is None:
        print("NVML read failed", file=sys.stderr)
        return 1
    node_j = sum(delta_mj(before, after)) / 1000.0
    energy = final.get("energy")
    print(f"GPUs: {meter.gpu_count} ({', '.join(after.methods)}); request took {elapsed:.2f} s")
    print(f"node GPU energy over the request window: {node_j:.2f} J (mean {node_j / elapsed:.0f} W)")
    print(f"usage: {json.dumps(final.get('usage'))}")
    print(f"energy billed by the gateway: {json.dumps(energy)}")
    measured = isinstance(energy, dict) and energy.get("measurement_source") == "nvml" and node_j > 0
    return 0 if measured else 1


def main() -> int:
    meter = NvmlMeter()
    if not meter.open():
        print(f"no usable GPU: {meter.unavailable_reason}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_check(meter))
    finally:
        meter.close()


if __name__ == "__main__":
    sys.exit(main())
