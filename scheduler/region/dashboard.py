"""What the Ray dashboard shows about the stack: Serve application statuses (its REST API)
and the scheduler's custom metrics (the Prometheus targets its service discovery lists)."""

from __future__ import annotations

import re

import httpx

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


async def serve_applications(dashboard_url: str, client: httpx.AsyncClient) -> dict[str, str]:
    """Application name -> status (``RUNNING`` ...), from ``GET /api/serve/applications/``."""
    response = await client.get(f"{dashboard_url}/api/serve/applications/", timeout=5.0)
    response.raise_for_status()
    applications = response.json().get("applications", {})
    return {name: str(app.get("status")) for name, app in applications.items()}


async def metric_samples(dashboard_url: str, client: httpx.AsyncClient, prefix: str) -> dict[str, float]:
    """Every sample whose name starts with ``prefix`` on the cluster's metrics ports, summed
    over the labels other than ``region`` (``name{region=...}`` -> value)."""
    response = await client.get(f"{dashboard_url}/api/prometheus/sd", timeout=5.0)
    response.raise_for_status()
    targets = [target for group in response.json() for target in group.get("targets", [])]
    samples: dict[str, float] = {}
    for target in targets:
        try:
            text = (await client.get(f"http://{target}/metrics", timeout=5.0)).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or not match["name"].startswith(prefix) or match["name"].endswith("_bucket"):
                continue
            region = re.search(r'region="([^"]*)"', match["labels"] or "")
            key = f"{match['name']}{{region={region.group(1)}}}" if region else match["name"]
            samples[key] = samples.get(key, 0.0) + float(match["value"])
    return samples
