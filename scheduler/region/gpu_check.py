"""``python -m scheduler.region.gpu_check``: on an NVIDIA machine, one region on one GPU (the
CUDA build of vLLM, ``pip install -e '.[gpu]'``), real requests straight to its gateway (one
alone, then ``CONCURRENT`` together), and what NVML measured:

- how often the driver updates the energy counter (GPU 0 polled for ``POLL_S``; the meter's
  resolution, ``nvml.READING_LAG_S``, assumes at most 0.1 s);
- the GPUs the pool's replica claims (its engine's workers, asked through vLLM's
  ``collective_rpc``): the gateway splits only those GPUs' joules among its requests;
- every meter interval the gateway closed (``GET /energy``): measured, attributed and idle
  joules and measured - attributed - idle, which rule "predicted-share-v1" keeps at float
  rounding;
- each request's ``energy`` object (its share, interval, batch), and their sum plus the idle
  joules against the node's GPU energy over the run.

Exit status 0 when every request was measured by NVML under the rule, every interval
conserved its joules and the replica named its GPUs; 2 without a usable GPU; 1 otherwise.
Tickets are off: the check posts to the gateway itself.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time
from typing import Any

import httpx

from scheduler.energy.attribution import ONLINE_RULE
from scheduler.energy.nvml import NvmlMeter, delta_mj
from scheduler.region.stack import LocalStack, StackOptions

REGION = "us-east"
PROMPT = "Explain, step by step, how the grid's carbon intensity changes through the day. " * 20
CONCURRENT = 8
POLL_S = 1.0
# Float rounding of a split: relative to the interval's joules.
CONSERVATION_TOLERANCE = 1e-9


def counter_period_s(meter: NvmlMeter, seconds: float = POLL_S) -> float | None:
    """The median time between changes of GPU 0's energy counter, polled every millisecond."""
    changes: list[float] = []
    last = meter.read()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and last is not None:
        reading = meter.read()
        if reading is not None and reading.energy_mj[0] != last.energy_mj[0]:
            changes.append(reading.at)
            last = reading
        time.sleep(0.001)
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    return statistics.median(gaps) if gaps else None


async def _generate(client: httpx.AsyncClient, url: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    final: dict[str, Any] = {}
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"energy"' in line:
                final = json.loads(line[6:])
    return final


def _conserved(intervals: list[dict[str, Any]]) -> bool:
    print(f"{'gpu':>3} {'start s':>9} {'length s':>8} {'measured J':>11} {'attributed J':>12} {'idle J':>8} "
          f"{'requests':>8} {'weighed by':>10} {'difference J':>13}")
    worst = 0.0
    for record in intervals:
        difference = record["measured_j"] - record["attributed_j"] - record["idle_j"]
        worst = max(worst, abs(difference) / max(record["measured_j"], 1e-12))
        print(f"{record['gpu']:>3} {record['start']:>9.3f} {record['end'] - record['start']:>8.3f} "
              f"{record['measured_j']:>11.3f} {record['attributed_j']:>12.3f} {record['idle_j']:>8.3f} "
              f"{record['requests']:>8} {record['weighed_by']:>10} {difference:>+13.2e}")
    print(f"{len(intervals)} intervals; largest |measured - attributed - idle| / measured: {worst:.1e}")
    return worst <= CONSERVATION_TOLERANCE


async def _check(meter: NvmlMeter) -> int:
    period = counter_period_s(meter)
    print(f"GPU 0's energy counter changes every {period * 1000:.1f} ms (median)" if period is not None
          else "GPU 0's energy counter did not change while polled")
    stack = LocalStack(StackOptions(only=(REGION,), state_url="memory", dashboard=False, http_port=0,
                                    device="gpu", carbon=False, tickets=False), say=print)
    await stack.start()
    try:
        url = f"{stack.endpoint(REGION)}/v1/completions"
        before, started = meter.read(), time.monotonic()
        async with httpx.AsyncClient(timeout=300) as client:
            finals = [await _generate(client, url, 1024)]
            finals += await asyncio.gather(*(_generate(client, url, 512) for _ in range(CONCURRENT)))
            await asyncio.sleep(1.0)  # the gateway's meter closes the last intervals
            after, elapsed = meter.read(), time.monotonic() - started
            energy = (await client.get(f"{stack.endpoint(REGION)}/energy")).json()
    finally:
        await stack.stop()
    if before is None or after is None:
        print("NVML read failed", file=sys.stderr)
        return 1
    node_j = sum(delta_mj(before, after)) / 1000.0
    print(f"GPUs: {meter.gpu_count} ({', '.join(after.methods)}); the run took {elapsed:.2f} s, "
          f"{node_j:.1f} J on the node's GPUs (mean {node_j / elapsed:.0f} W)")
    print(f"replicas: {json.dumps(energy['replicas'])}")
    conserved = _conserved(energy["intervals"])
    billed = 0.0
    measured = True
    for k, final in enumerate(finals):
        e = final.get("energy") or {}
        billed += float(e.get("energy_j") or 0.0)
        measured &= e.get("measurement_source") == "nvml" and e.get("attribution_method") == ONLINE_RULE
        print(f"request {k} ({'alone' if k == 0 else 'together'}): usage {json.dumps(final.get('usage'))}; "
              f"energy {e.get('energy_j', 0.0):.2f} J [{e.get('energy_j_low', 0.0):.2f}, "
              f"{e.get('energy_j_high', 0.0):.2f}], confidence {e.get('confidence', 0.0):.3f}, batch "
              f"{e.get('batch_size', 0.0):.2f}, {e.get('measurement_source')} / {e.get('attribution_method')}")
    idle = sum(energy["idle_j"].values())
    print(f"billed {billed:.1f} J + idle {idle:.1f} J ({energy['idle_j']}) = {billed + idle:.1f} J of the gateway's "
          f"intervals since it started; the node's GPUs spent {node_j:.1f} J over the run")
    claimed = all(r["gpus"] for r in energy["replicas"].values())
    if not claimed:
        print("a replica did not name its GPUs (see its log): its requests share the unclaimed GPUs", file=sys.stderr)
    return 0 if measured and conserved and claimed and node_j > 0 else 1


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
