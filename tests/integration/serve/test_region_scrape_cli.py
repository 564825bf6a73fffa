"""``scheduler region scrape --once`` against real HTTP servers on port 0 answering as vLLM does,
publishing into real Redis (DB 4); and the command's refusals, with their exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS
from scheduler.state import codec, keys
from scheduler.state.factory import open_store
from tests.unit.config.test_vllm_region import VLLM_REGION
from tests.unit.region.test_vllm_scrape import Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_REGIONS", "redis://127.0.0.1:6379/4")


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-scrape-{uuid.uuid4().hex[:10]}"
    yield name
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        found = [key async for key in client.scan_iter(match=f"sched:{name}:*")]
        if found:
            await client.delete(*found)
    finally:
        await client.aclose()


def regions_dir(tmp_path: Path, urls: list[str]) -> Path:
    folder = tmp_path / "regions"
    folder.mkdir()
    raw = yaml.safe_load(VLLM_REGION)
    raw["pools"][0]["vllm"] = {"urls": urls, "served_model_names": {"llama-3.1-8b": "served-8b"}}
    (folder / "eu-byo.yaml").write_text(yaml.safe_dump(raw))
    return folder


async def scrape(regions: Path, *args: str) -> int:
    # The command runs its own event loop: in a thread, while the servers answer on this one.
    return await asyncio.to_thread(main, ["region", "scrape", "--regions", str(regions),
                                          "--policies", str(EMBEDDED_POLICIES), *args])


async def test_once_publishes_one_pass_and_prints_it(tmp_path: Path, namespace: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    server = await Server().start()
    try:
        regions = regions_dir(tmp_path, [server.url])
        code = await scrape(regions, "--region", "eu-byo", "--state", REDIS_URL, "--namespace", namespace, "--once")
    finally:
        await server.stop()
    assert code == exit_codes.OK
    printed = json.loads(capsys.readouterr().out)
    assert printed["healthy"] and printed["pools"]["a100-chat"]["models"] == {"llama-3.1-8b": 4096}
    store = open_store(REDIS_URL, namespace)
    try:
        raw = await store.get(keys.region_state("eu-byo"))
    finally:
        await store.close()
    assert raw is not None and codec.decode_region_state(raw).pools["a100-chat"].replicas == 1

    # Its server gone: published as unhealthy (the routers stop sending there at once), exit 1.
    code = await scrape(regions, "--region", "eu-byo", "--state", REDIS_URL, "--namespace", namespace, "--once",
                        "--timeout", "0.5")
    assert code == exit_codes.FAILURE
    assert json.loads(capsys.readouterr().out) | {"observed_at": 0} == {
        "region": "eu-byo", "healthy": False, "observed_at": 0, "pools": {}}


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--region", "eu-north", "--regions", str(EMBEDDED_REGIONS), "--state", REDIS_URL], exit_codes.CONFIG,
     "--region eu-north: its kind is 'ray-serve': its gateway publishes its own live state"),
    (["--region", "nowhere", "--regions", str(EMBEDDED_REGIONS), "--state", REDIS_URL], exit_codes.CONFIG,
     "--region: no region 'nowhere' in"),
    (["--region", "eu-byo", "--state", "memory"], exit_codes.USAGE,
     "--state: the routers' shared store, redis://HOST:PORT/DB (an in-memory store reaches no router)"),
    (["--region", "eu-byo", "--state", REDIS_URL, "--interval", "0"], exit_codes.USAGE,
     "--interval and --timeout: expected seconds > 0"),
], ids=["a ray-serve region", "an unknown region", "an in-memory store", "no interval"])
def test_refusals_say_what_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int,
                                  message: str) -> None:
    regions = regions_dir(tmp_path, ["http://127.0.0.1:1"])
    given = args if "--regions" in args else [*args, "--regions", str(regions)]
    assert main(["region", "scrape", "--policies", str(EMBEDDED_POLICIES), *given]) == code
    assert message in capsys.readouterr().err
