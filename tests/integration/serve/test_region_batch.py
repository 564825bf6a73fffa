"""The region bills a request at the batch of the replica that ran it, from the replica's own
reports (real Ray Serve + vLLM CPU engine, the tiny model): requests run together on
h200-long's replica are billed at about their number, one alone at 1. The reports and the
engine's continuous usage never reach the client; ``GET /energy`` lists the replica."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from scheduler.region.stack import LocalStack
from tests.integration.serve.conftest import REGION, ticket_headers

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOGETHER = 4


async def call(stack: LocalStack, client: httpx.AsyncClient, prompt: str, max_tokens: int) -> list[str]:
    body: dict[str, Any] = {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": max_tokens,
                            "ignore_eos": True, "stream": True}
    async with client.stream("POST", f"{stack.endpoint(REGION)}/v1/completions", json=body,
                             headers=ticket_headers(stack, body)) as response:
        assert response.status_code == 200, await response.aread()
        return [line async for line in response.aiter_lines() if line.startswith("data: {")]


@pytest.mark.timeout(180)
async def test_requests_are_billed_at_the_running_batch_of_their_replica(stack: LocalStack) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        alone = await call(stack, client, "One question alone?", 48)
        together = await asyncio.gather(*(call(stack, client, f"Question {k} of a batch?", 48)
                                          for k in range(TOGETHER)))
        energy = (await client.get(f"{stack.endpoint(REGION)}/energy")).json()
    for lines in (alone, *together):
        assert not any("x_replica" in line for line in lines)
        chunks = [json.loads(line[6:]) for line in lines]
        assert all(chunk.get("usage") is None for chunk in chunks if chunk["choices"])
        assert chunks[-1]["usage"]["completion_tokens"] == 48
        assert chunks[-1]["energy"]["measurement_source"] == "model"
    batches = [json.loads(lines[-1][6:])["energy"]["batch_size"] for lines in together]
    alone_batch = json.loads(alone[-1][6:])["energy"]["batch_size"]
    print(f"\nbatch alone {alone_batch:.2f}; {TOGETHER} together {[round(b, 2) for b in batches]}; "
          f"replicas {energy['replicas']}")
    assert alone_batch == pytest.approx(1.0, abs=0.3)
    assert all(TOGETHER / 2 < b <= TOGETHER + 1e-6 for b in batches)
    replicas = [r for r in energy["replicas"].values() if r["pool"] == "h200-long"]
    assert len(replicas) == 1 and replicas[0]["in_flight"] == 0 and replicas[0]["gpus"] == []
    assert energy["rule"] == "predicted-share-v1" and energy["intervals"] == []  # no GPU to meter here
