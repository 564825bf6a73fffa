"""The router as the manifests run it keeps the Redis password out of its arguments.

``infra/router/deployment.yaml``'s container arguments (its mount paths moved under a temporary
folder, its ports and hosts made local) and its environment, with the Secret's value for
``SCHEDULER_STATE``, start ``scheduler router`` against a private Redis that requires that
password. What ``ps`` and ``/proc/<pid>/cmdline`` show of the process holds no password, and the
router did reach the store: it answers GetStatus with the store reachable, and it published its
operator-signed files there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from scheduler.client import SchedulerClient
from scheduler.server.auth import create_key
from scheduler.server.config_reload.sources import ConfigSources, read_bundle
from scheduler.server.config_signing import SigningKey, trust_entry
from scheduler.tickets import TicketKeyRing
from tests.unit.infra.infra_files import INFRA, container, one

pytestmark = pytest.mark.integration

PASSWORD = "router-pw-7f3a9c"
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")
# Flags whose values the test makes local (the manifest's are for a pod).
LOCAL = {"--host": "127.0.0.1", "--port": "0", "--metrics-host": "127.0.0.1", "--metrics-port": "0",
         "--http-host": "127.0.0.1", "--http-port": "0"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def password_redis(directory: Path) -> Iterator[int]:
    """A private redis-server whose default user needs ``PASSWORD`` (never the shared one)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (.ci/run and the fault tests need it: apt-get install redis-server)"
    port = _free_port()
    # The password goes in a config file: this test's own processes keep it off their argv too.
    conf = directory / "redis.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {directory}\nrequirepass {PASSWORD}\n")
    server = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with redis.Redis(port=port, password=PASSWORD, socket_timeout=0.5) as client:
                    if client.ping():
                        break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def _localised(args: list[str], mounts: dict[str, Path]) -> list[str]:
    out = []
    for arg in args:
        flag, sep, value = arg.partition("=")
        if sep and flag in LOCAL:
            arg = f"{flag}={LOCAL[flag]}"
        for mount, local in mounts.items():
            if sep and (value == mount or value.startswith(mount + "/")):
                arg = f"{flag}={local}{value[len(mount):]}"
        out.append(arg)
    return out


@pytest.mark.timeout(120)
def test_a_router_started_from_the_manifest_has_no_password_in_its_arguments(tmp_path: Path) -> None:
    deployment = one("Deployment", "scheduler-router")
    router = container(deployment, "router")
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in router["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    by_name = {m["name"]: mounts[m["mountPath"]] for m in router["volumeMounts"]}
    # What the ConfigMaps and Secrets would hold.
    config = INFRA / "router" / "config"
    for name in ("regions", "policies"):
        for path in (config / name).glob("*.yaml"):
            shutil.copy(path, by_name[name])
    shutil.copy(INFRA / "router" / "budgets.yaml", by_name["budgets"] / "budgets.yaml")
    admin = create_key("ops", admin=True)
    (by_name["keys"] / "keys.yaml").write_text(yaml.safe_dump({"keys": [admin.entry_dict()]}))
    regions = [p.stem for p in by_name["regions"].glob("*.yaml")]
    (by_name["tickets"] / "keys.yaml").write_text(TicketKeyRing.generate(regions).to_yaml())
    operator = SigningKey.generate("ops-1")
    (by_name["config-trust"] / "trust.yaml").write_text(trust_entry(operator))
    bundle = read_bundle(ConfigSources(by_name["regions"], by_name["policies"], "default",
                                       by_name["keys"] / "keys.yaml", by_name["budgets"] / "budgets.yaml"))
    (by_name["config-signature"] / "config.sig").write_text(operator.sign(bundle.digest, time.time()).to_text())

    args = _localised(list(router["args"]), mounts)
    with password_redis(tmp_path) as port:
        secret_url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
        env = {**os.environ}
        env.pop("SCHEDULER_STATE", None)
        for entry in router["env"]:
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            elif entry["valueFrom"]["secretKeyRef"] == {"name": "scheduler-redis-router", "key": "url"}:
                env[entry["name"]] = secret_url  # what the kubelet puts in the environment
        assert env.get("SCHEDULER_STATE") == secret_url
        # The kubelet expands $(VAR) in args from the container's environment.
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a) for a in args]
        log = tmp_path / "router.log"
        process = subprocess.Popen([sys.executable, "-m", "scheduler.cli", *argv], env=env,
                                   stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        try:
            assert process.stdout is not None
            listening = LISTENING.search(process.stdout.readline())
            assert listening, log.read_text()
            cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(process.pid)], capture_output=True, text=True,
                                timeout=10, check=True).stdout
            assert "router" in cmdline and "--namespace=prod" in ps
            for shown in (cmdline, ps):
                assert PASSWORD not in shown and "redis://" not in shown, shown
            assert PASSWORD not in log.read_text()

            # It read the URL from its environment and reached the store with the password.
            with SchedulerClient(f"127.0.0.1:{listening.group(1)}", api_key=admin.key) as client:
                status = client.status()
            assert status.state_backend == "redis" and status.namespace == "prod"
            deadline = time.monotonic() + 10
            with redis.Redis(port=port, password=PASSWORD) as store:
                while (head := store.get("sched:prod:config:head")) is None:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
                record = json.loads(store.get(f"sched:prod:config:version:{json.loads(head)['counter']}") or b"{}")
            assert record["digest"] == bundle.digest and record["signature"]["key_id"] == "ops-1"
            with SchedulerClient(f"127.0.0.1:{listening.group(1)}", api_key=admin.key) as client:
                status = client.status()
            assert status.state_reachable and status.config_version == f"1-{bundle.digest[:12]}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
