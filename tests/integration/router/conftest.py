"""Router fixtures: stub regions (real HTTP servers on port 0), a router (real gRPC server on
port 0) over a small fleet whose endpoints point at them, API keys and TLS certificates."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.ledger.budget import TenantBudget
from scheduler.server.app import (
    GrpcLimits,
    RouterDeps,
    RunningRouter,
    TlsFiles,
    build_deps,
    start_router,
    with_services,
)
from scheduler.server.auth import KeyRing, NewKey, create_key
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.server.tracing import RouterTracing
from scheduler.state.memory_store import MemoryStore
from scheduler.tickets import TicketKeyRing

# Three regions: two in the EU (so an EU request has a second choice), one in the US.
TEST_REGIONS = ("eu-north", "eu-central", "us-east")


@dataclass
class Fleet:
    regions: dict[str, StubRegion]
    configs: tuple[RegionConfig, ...]


@dataclass
class Keys:
    tenant: NewKey
    other_tenant: NewKey
    admin: NewKey
    ring: KeyRing = field(init=False)

    def __post_init__(self) -> None:
        self.ring = KeyRing.of([self.tenant.entry, self.other_tenant.entry, self.admin.entry])


@pytest.fixture
def keys() -> Keys:
    return Keys(create_key("acme"), create_key("globex", rate_limit_rps=2.0), create_key("ops", admin=True))


@contextlib.asynccontextmanager
async def stub_regions(**settings: Any) -> AsyncIterator[Fleet]:
    """The test regions, each served by a stub region with ``settings`` (StubRegionSettings'
    fields: a slow one, a failing one ...), stopped on exit."""
    shipped = {r.name: r for r in load_fleet().regions}
    stubs = {name: await StubRegion(StubRegionSettings(name=name, **settings)).start() for name in TEST_REGIONS}
    try:
        configs = tuple(shipped[n].model_copy(update={"endpoint": stubs[n].endpoint}) for n in TEST_REGIONS)
        yield Fleet(stubs, configs)
    finally:
        for stub in stubs.values():
            await stub.stop()


@pytest.fixture
async def stub_fleet() -> AsyncIterator[Fleet]:
    async with stub_regions() as fleet:
        yield fleet


# Seconds between two tokens of the slow fleet's regions: a stream lasts long enough to leave it.
SLOW_TOKEN_S = 0.05


@pytest.fixture
async def slow_fleet() -> AsyncIterator[Fleet]:
    async with stub_regions(token_interval_s=SLOW_TOKEN_S) as fleet:
        yield fleet


RouterFactory = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def make_router() -> AsyncIterator[RouterFactory]:
    """Start a router on 127.0.0.1:0 over ``regions``; stopped at teardown."""
    started: list[RunningRouter] = []

    async def make(regions: Sequence[RegionConfig], keys: KeyRing | None = None, tls: TlsFiles | None = None,
                   rate_limit_rps: float = 1000.0, store: MemoryStore | None = None,
                   budgets: Mapping[str, TenantBudget] | None = None,
                   metrics_port: int | None = None, http: bool = False,
                   ticket_keys: TicketKeyRing | None = None, tracing: RouterTracing | None = None,
                   policy: PolicyConfig | None = None, grpc_limits: GrpcLimits | None = None,
                   deferral: DeferralSettings | None = None) -> RunningRouter:
        fleet = load_fleet()
        deps: RouterDeps = build_deps(SnapshotBuilder(compile_fleet(tuple(regions)),
                                                      compile_policy(policy or fleet.policy("default"))),
                                      store or MemoryStore(), "memory", keys=keys, tls=tls,
                                      rate_limit_rps=rate_limit_rps, metrics_port=metrics_port,
                                      ticket_keys=ticket_keys, deferral=deferral)
        deps.http_port = 0 if http else None
        if grpc_limits is not None:
            deps.grpc_limits = grpc_limits
        if tracing is not None:
            deps.tracing = tracing
        if budgets is not None:
            with_services(deps, carbon_pollers=False, budgets=budgets)
        running = await start_router("127.0.0.1:0", deps)
        started.append(running)
        return running

    yield make
    for running in started:
        await running.stop(grace_s=0.5)


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # A client certificate from a CA the server does not trust.
    rogue_cert: Path
    rogue_key: Path


def _write_certs(directory: Path) -> Certs:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def ca_cert(ca_key: ec.EllipticCurvePrivateKey, common: str) -> x509.Certificate:
        return (x509.CertificateBuilder().subject_name(name(common)).issuer_name(name(common))
                .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))

    def leaf(issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey, common: str,
             usage: x509.ObjectIdentifier) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        leaf_key = key()
        cert = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(issuer.subject)
                .public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(issuer_key, hashes.SHA256()))
        return cert, leaf_key

    def write(path: Path, cert: x509.Certificate | None = None, private: ec.EllipticCurvePrivateKey | None = None) -> Path:
        if cert is not None:
            path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if private is not None:
            path.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        return path

    ca_key, rogue_ca_key = key(), key()
    ca = ca_cert(ca_key, "test CA")
    rogue_ca = ca_cert(rogue_ca_key, "rogue CA")
    server, server_key = leaf(ca, ca_key, "localhost", ExtendedKeyUsageOID.SERVER_AUTH)
    client, client_key = leaf(ca, ca_key, "client", ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue, rogue_key = leaf(rogue_ca, rogue_ca_key, "rogue", ExtendedKeyUsageOID.CLIENT_AUTH)
    return Certs(
        ca=write(directory / "ca.pem", ca),
        server_cert=write(directory / "server.pem", server), server_key=write(directory / "server.key", None, server_key),
        client_cert=write(directory / "client.pem", client), client_key=write(directory / "client.key", None, client_key),
        rogue_cert=write(directory / "rogue.pem", rogue), rogue_key=write(directory / "rogue.key", None, rogue_key),
    )


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return _write_certs(tmp_path)
