"""``scheduler admin`` against a real router (gRPC on port 0, stub regions): status, regions and
the kill switch, with an admin key, a tenant's key, no key, TLS, and no router at all."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence

import pytest

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.client import AsyncSchedulerClient
from scheduler.server.app import RunningRouter, TlsFiles
from scheduler.state.keys import FLAGS

from .conftest import TEST_REGIONS, Certs, Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``scheduler admin ARGV`` in a thread (the router runs on this loop): exit code, stdout, stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["admin", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def at(router: RunningRouter) -> Sequence[str]:
    return ("--router", f"127.0.0.1:{router.port}")


async def energy_routing(router: RunningRouter, key: str) -> bool:
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=key) as client:
        return (await client.status()).energy_routing


async def test_status_as_text_and_json(make_router: RouterFactory, stub_fleet: Fleet, keys: Keys,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    code, out, err = await admin(capsys, "status", *at(router), "--api-key", keys.admin.key)
    assert code == exit_codes.OK, err
    assert "energy routing  on" in out
    assert f"of {len(TEST_REGIONS)} healthy" in out and "policy          default" in out
    code, out, _ = await admin(capsys, "status", *at(router), "--api-key", keys.admin.key, "--json")
    answer = json.loads(out)
    assert code == exit_codes.OK
    assert (answer["regions"], answer["policy"], answer["energy_routing"], answer["state_backend"]) == (
        len(TEST_REGIONS), "default", True, "memory")


async def test_the_kill_switch_turns_energy_routing_off_and_back_on(
        make_router: RouterFactory, stub_fleet: Fleet, keys: Keys, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    monkeypatch.setenv("SCHEDULER_API_KEY", keys.admin.key)  # the key from the environment
    code, out, err = await admin(capsys, "kill-switch", "on", "--reason", "carbon feed wrong", *at(router))
    assert code == exit_codes.OK, err
    assert "kill switch on" in out and "ops@" in out
    assert await energy_routing(router, keys.admin.key) is False
    flags = json.loads(await router.deps.store.get(FLAGS) or b"{}")
    assert flags["reason"] == "carbon feed wrong"
    code, out, _ = await admin(capsys, "status", *at(router))
    assert "energy routing  OFF" in out
    code, out, err = await admin(capsys, "kill-switch", "off", *at(router))
    assert code == exit_codes.OK, err
    assert await energy_routing(router, keys.admin.key) is True


async def test_regions_lists_the_fleet_as_the_router_sees_it(make_router: RouterFactory, stub_fleet: Fleet,
                                                             keys: Keys, capsys: pytest.CaptureFixture[str]) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    # Any tenant may list the regions; it is the GlobalRouter's ListRegions.
    code, out, err = await admin(capsys, "regions", *at(router), "--api-key", keys.tenant.key, "--json")
    assert code == exit_codes.OK, err
    regions = {r["name"]: r for r in json.loads(out)["regions"]}
    assert sorted(regions) == sorted(TEST_REGIONS)
    assert {name: r["endpoint"] for name, r in regions.items()} == {
        name: stub.endpoint for name, stub in stub_fleet.regions.items()}
    code, out, _ = await admin(capsys, "regions", *at(router), "--api-key", keys.tenant.key)
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["region", "health", "state"]
    assert sorted(row.split()[0] for row in rows) == sorted(TEST_REGIONS)
    eu_north = next(row for row in rows if row.startswith("eu-north"))
    assert " NO " in eu_north and "H200-141GB" in eu_north


async def test_a_tenant_key_or_no_key_cannot_use_the_kill_switch(make_router: RouterFactory, stub_fleet: Fleet,
                                                                 keys: Keys, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_API_KEY", raising=False)
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    code, _, err = await admin(capsys, "kill-switch", "on", "--reason", "x", *at(router), "--api-key", keys.tenant.key)
    assert code == exit_codes.FAILURE
    assert "PERMISSION_DENIED" in err and f"127.0.0.1:{router.port}" in err
    code, _, err = await admin(capsys, "status", *at(router))
    assert code == exit_codes.FAILURE and "UNAUTHENTICATED" in err
    assert await energy_routing(router, keys.admin.key) is True


async def test_over_tls(make_router: RouterFactory, stub_fleet: Fleet, keys: Keys, certs: Certs,
                        capsys: pytest.CaptureFixture[str]) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, tls=TlsFiles(certs.server_cert, certs.server_key))
    code, _, err = await admin(capsys, "status", *at(router), "--api-key", keys.admin.key)
    assert code == exit_codes.FAILURE and "UNAVAILABLE" in err  # plaintext to a TLS port
    code, out, err = await admin(capsys, "status", *at(router), "--api-key", keys.admin.key,
                                 "--tls-ca", str(certs.ca), "--server-name", "localhost")
    assert code == exit_codes.OK, err
    assert "energy routing  on" in out


async def test_no_router_is_a_failure_naming_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = await admin(capsys, "status", "--router", f"127.0.0.1:{port}", "--timeout", "2")
    assert code == exit_codes.FAILURE and out == ""
    assert f"router at 127.0.0.1:{port}: UNAVAILABLE" in err


@pytest.mark.parametrize("argv", [
    ("kill-switch", "on"),                                 # no --reason
    ("kill-switch", "maybe", "--reason", "x"),
    ("status", "--tls-cert", "client.pem"),                # a certificate without its key
], ids=lambda a: " ".join(a))
async def test_usage_errors_exit_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code, _, _ = await admin(capsys, *argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    assert code == exit_codes.USAGE
