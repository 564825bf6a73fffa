"""``scheduler signals fetch`` against a provider server and ``scheduler signals show`` on the
real Redis (DB 2)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from scheduler.cli import main
from scheduler.datalayer.carbon.store_io import write_forecast, write_signal
from scheduler.state.redis_store import RedisStore
from scheduler.types import Signal
from tests.integration.carbon.carbon_apis import ApiServer, ElectricityMapsApi, UkciApi
from tests.integration.carbon.conftest import REDIS_URL

pytestmark = pytest.mark.integration


def test_fetch_prints_signals_as_json(capsys, monkeypatch):
    now = time.time()
    observed = now - now % 3600
    server = ApiServer(ElectricityMapsApi("em-secret", {"DE": (312.0, observed)})).start()
    monkeypatch.setenv("ELECTRICITYMAPS_API_KEY", "em-secret")
    try:
        code = main(["signals", "fetch", "--provider", "electricitymaps", "--zone", "DE", "--base-url", server.url,
                     "--json"])
    finally:
        server.stop()
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out) == 25
    first = out[0]
    assert {k: first[k] for k in ("zone", "value", "unit", "observed_at", "is_forecast")} == {
        "zone": "DE", "value": 312.0, "unit": "gCO2eq/kWh", "observed_at": observed, "is_forecast": False}
    assert first["source"] == "electricitymaps:/v3/carbon-intensity/latest" and first["fetched_at"] >= now
    assert all(item["is_forecast"] for item in out[1:])


def test_fetch_reports_failures_and_exits_1(capsys):
    server = ApiServer(UkciApi(now=time.time(), forecast=180.0, actual=None)).start()
    try:
        code = main(["signals", "fetch", "--provider", "ukci", "--zone", "FR", "--base-url", server.url])
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert code == 1 and "unknown_zone" in err and "zone 'FR'" in err


def test_show_marks_stale_signals_against_the_policy(capsys):
    namespace = f"carbon-cli-{uuid.uuid4().hex[:8]}"
    now = time.time()
    fresh = Signal("carbon_intensity", "NO", 28.0, "gCO2eq/kWh", now - 600, now - 590, "csv:NO_2023_hourly.csv")
    stale = Signal("carbon_intensity", "DE-LU", 450.0, "gCO2eq/kWh", now - 3 * 3600, now - 3 * 3600, "electricitymaps")

    async def seed() -> None:
        store = RedisStore.from_url(REDIS_URL, namespace)
        await write_signal(store, fresh)
        await write_signal(store, stale)
        await write_forecast(store, "NO", [fresh] * 3)
        await store.close()

    async def clean() -> None:
        store = RedisStore.from_url(REDIS_URL, namespace)
        for key in await store.keys(""):
            await store.delete(key)
        await store.close()

    asyncio.run(seed())
    try:
        code = main(["signals", "show", "--state", REDIS_URL, "--namespace", namespace, "--json"])
        shown = json.loads(capsys.readouterr().out)
        text_code = main(["signals", "show", "--state", REDIS_URL, "--namespace", namespace])
        text = capsys.readouterr().out
    finally:
        asyncio.run(clean())
    assert code == 0 and text_code == 0
    assert shown["max_age_s"] == 7200.0 and shown["policy"] == "default"
    by_zone = {row["zone"]: row for row in shown["signals"]}
    assert by_zone["DE-LU"]["stale"] and not by_zone["NO"]["stale"]
    assert by_zone["DE-LU"]["age_s"] == pytest.approx(3 * 3600, abs=5)
    assert by_zone["NO"]["forecast_points"] == 3
    assert "STALE carbon_intensity  DE-LU" in text and "ok    carbon_intensity  NO" in text
