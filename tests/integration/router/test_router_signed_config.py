"""Signed config with a real router process on Redis: what the operator publishes with
``scheduler config publish`` is adopted; what someone else writes into the router's Redis keys
(an admin key added without a signature, a region endpoint moved under a forged signature) is
refused, and the router says so on /metrics, in GetStatus and in its log."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import yaml

from scheduler.client import SchedulerClient, SchedulerRpcError
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS
from scheduler.server.auth import create_key
from scheduler.server.config_reload.sources import ConfigBundle, ConfigSources, read_bundle
from scheduler.server.config_reload.store import ConfigStore
from scheduler.server.config_signing import SigningKey
from scheduler.state.redis_store import RedisStore
from scheduler.tickets import TicketKeyRing
from scheduler.v1 import admin_pb2

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
REGIONS = ("eu-north", "eu-central", "us-east")
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")
METRICS = re.compile(r"metrics on (http://\S+/metrics)")


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"test-signed-config-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    found = list(client.scan_iter(match=f"sched:{name}:*"))
    if found:
        client.delete(*found)
    client.close()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_the_router_adopts_the_operators_versions_and_refuses_the_rest(tmp_path: Path, namespace: str) -> None:
    regions, policies = tmp_path / "regions", tmp_path / "policies"
    regions.mkdir()
    policies.mkdir()
    for name in REGIONS:
        shutil.copy(EMBEDDED_REGIONS / f"{name}.yaml", regions)
    for path in EMBEDDED_POLICIES.glob("*.yaml"):
        shutil.copy(path, policies)
    admin, intruder = create_key("ops", admin=True), create_key("mallory", admin=True)
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [admin.entry_dict()]}))
    tickets = tmp_path / "tickets.yaml"
    tickets.write_text(TicketKeyRing.generate(REGIONS).to_yaml())
    state = tmp_path / "state-url"
    state.write_text(REDIS_URL)
    operator_key, trust = tmp_path / "ops-1.key", tmp_path / "trust.yaml"
    cli = [sys.executable, "-m", "scheduler.cli"]
    subprocess.run([*cli, "config", "keygen", "--kid", "ops-1", "--out", str(operator_key), "--trust", str(trust)],
                   check=True, timeout=60, capture_output=True)
    files = ["--regions", str(regions), "--policies", str(policies), "--keys", str(keys)]

    def publish() -> str:
        env = {**os.environ, "SCHEDULER_CONFIG_SIGNING_KEY_FILE": str(operator_key), "SCHEDULER_STATE": REDIS_URL}
        done = subprocess.run([*cli, "config", "publish", *files, "--namespace", namespace], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        found = re.search(r"config version (\S+) published", done.stdout)
        assert found, done.stdout
        return found.group(1)

    log = tmp_path / "router.log"
    process = subprocess.Popen(
        [*cli, "router", "--port", "0", *files, "--ticket-keys", str(tickets), "--state-file", str(state),
         "--namespace", namespace, "--config-trust", str(trust), "--metrics-port", "0", "--no-carbon-pollers",
         "--config-sync-interval", "0.5", "--keys-reload-interval", "0", "--grace", "1"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        assert process.stdout is not None
        port, metrics = LISTENING.search(process.stdout.readline()), METRICS.search(process.stdout.readline())
        assert port and metrics, log.read_text()
        target = f"127.0.0.1:{port.group(1)}"

        def status() -> admin_pb2.GetStatusResponse:
            with SchedulerClient(target, api_key=admin.key) as client:
                return client.status()

        def scraped() -> str:
            with urllib.request.urlopen(metrics.group(1), timeout=5) as answer:
                text: str = answer.read().decode()
                return text

        # Its own files are not signed: it runs on them until the operator publishes.
        assert status().config_version.startswith("local-")
        first = publish()
        assert first.startswith("1-")
        _wait(lambda: status().config_version == first, 10, "the operator's version adopted")

        # Someone with the router's Redis password writes the next versions.
        bundle = read_bundle(ConfigSources(regions, policies, "default", keys))
        evil_keys = yaml.safe_dump({"keys": [admin.entry_dict(), intruder.entry_dict()]})
        with_intruder = ConfigBundle(bundle.regions, bundle.policies, evil_keys, None)
        moved = dict(bundle.regions)
        moved["eu-north.yaml"] = moved["eu-north.yaml"].replace("http://127.0.0.1:8000/eu-north",
                                                                "http://attacker.example/eu-north")
        redirected = ConfigBundle(moved, bundle.policies, bundle.keys, None)
        forged = SigningKey.generate("ops-1")  # the operator's key id, another key

        async def write(bundle: ConfigBundle, after: int, signer: SigningKey | None) -> None:
            store = RedisStore.from_url(REDIS_URL, namespace)
            try:
                signature = signer.sign(bundle.digest, time.time()) if signer is not None else None
                await ConfigStore(store).publish(bundle, after, "mallory", time.time(), "evil", signature)
            finally:
                await store.close()

        asyncio.run(write(with_intruder, 1, None))
        _wait(lambda: status().config_rejected == 1, 10, "the unsigned record refused")
        asyncio.run(write(redirected, 2, forged))
        _wait(lambda: status().config_rejected == 2, 10, "the forged record refused")
        answer = status()
        assert answer.config_version == first
        assert answer.config_last_rejection.startswith("3-")
        assert "bad_signature" in answer.config_last_rejection
        text = scraped()
        assert 'scheduler_config_rejected_total{reason="unsigned"} 1' in text
        assert 'scheduler_config_rejected_total{reason="bad_signature"} 1' in text
        assert 'scheduler_config_signed{key_id="ops-1"} 1' in text
        with SchedulerClient(target, api_key=intruder.key) as client, pytest.raises(SchedulerRpcError,
                                                                                  match="UNAUTHENTICATED"):
            client.status()
        refusals = [line for line in log.read_text().splitlines() if "problem(s) in version" in line]
        assert len(refusals) == 2 and "(unsigned)" in refusals[0] and "(bad_signature)" in refusals[1], refusals

        # The operator's next version goes through.
        text_of = (policies / "default.yaml").read_text()
        assert "region_state: 5s" in text_of
        (policies / "default.yaml").write_text(text_of.replace("region_state: 5s", "region_state: 7s"))
        fourth = publish()
        assert fourth.startswith("4-")
        _wait(lambda: status().config_version == fourth, 10, "the operator's next version adopted")
        assert status().config_rejected == 2
    finally:
        process.terminate()
        try:
            assert process.wait(timeout=30) == 0
        except subprocess.TimeoutExpired:
            process.kill()
            raise
