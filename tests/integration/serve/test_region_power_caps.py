"""The region's serving side set (here: dry-ran, no GPU) its pools' power caps at start, and
``GET /<region>/power-caps`` shows it; the demo's report section reads the same."""

from __future__ import annotations

import httpx
import pytest

from scheduler.region import demo
from scheduler.region.power_caps import RegionCapReport
from scheduler.region.stack import LocalStack
from tests.integration.serve.conftest import REGION

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.timeout(120)
async def test_the_region_shows_the_power_caps_it_set_at_start(stack: LocalStack) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{stack.endpoint(REGION)}/power-caps", timeout=30)
        assert answer.status_code == 200
        report = RegionCapReport.from_dict(answer.json())
        assert report.region == REGION and report.mode == "dry-run"  # this machine has no GPU
        assert [p.pool for p in report.pools] == ["h200-long", "a100-batch"]
        for pool in report.pools:
            assert not pool.applied and pool.target_w == pool.configured_w == pool.tdp_w
            assert pool.eco_w < pool.tdp_w
        fetched = await demo.fetch_power_caps(stack.regions, stack.endpoint, http)
    assert fetched == [report]
    section = "\n".join(demo.power_cap_section(fetched))
    assert section.count("dry run: no GPU") == 2 and "nothing was set" in section
