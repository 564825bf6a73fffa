"""Private Redis deployments started by tests, as operators run them: a 3-node Redis Cluster
and a Sentinel watching a master. Child processes on free ports in a temporary folder,
stopped by their own handles (the shared server at 127.0.0.1:6379 is never touched)."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.faults.redis_server import free_port


def cluster_port() -> int:
    """A free port below 55,536 whose cluster bus port (+10,000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (apt-get install redis-server redis-tools)")
    return found


def _wait_ping(port: int, process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with redis.Redis(port=port, socket_timeout=0.5) as client:
                if client.ping():
                    return
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis on port {port} did not start") from None
            time.sleep(0.05)


@dataclass
class RedisDeployment:
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.processes.clear()


@dataclass
class PrivateCluster(RedisDeployment):
    """Three masters, no replicas, every slot covered."""

    ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> PrivateCluster:
        server = _binary("redis-server")
        self.ports = [cluster_port() for _ in range(3)]
        for port in self.ports:
            process = self._spawn(server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                                  "--cluster-config-file", f"nodes-{port}.conf", "--save", "", "--appendonly", "no",
                                  "--dir", str(self.directory))
            _wait_ping(port, process)
        subprocess.run([_binary("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 20
        while not all(self._ok(port) for port in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        return self

    @staticmethod
    def _ok(port: int) -> bool:
        with redis.Redis(port=port, socket_timeout=1) as client:
            info = client.execute_command("CLUSTER", "INFO")
        return b"cluster_state:ok" in info


@dataclass
class PrivateSentinel(RedisDeployment):
    """One master and one Sentinel that watches it under the service name ``sched``."""

    master_port: int = 0
    sentinel_port: int = 0

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/sched/0"

    def start(self) -> PrivateSentinel:
        server = _binary("redis-server")
        self.master_port, self.sentinel_port = free_port(), free_port()
        master = self._spawn(server, "--port", str(self.master_port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(self.directory))
        _wait_ping(self.master_port, master)
        config = self.directory / "sentinel.conf"
        config.write_text(f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.directory}\n"
                          f"sentinel monitor sched 127.0.0.1 {self.master_port} 1\n")
        sentinel = self._spawn(server, str(config), "--sentinel")
        _wait_ping(self.sentinel_port, sentinel)
        return self


@dataclass
class PrivateTlsRedis(RedisDeployment):
    """One server that speaks only TLS and knows only one ACL user, ``router`` (the default user
    off), limited to the ``sched:*`` keys and without the dangerous commands."""

    port: int = 0
    password: str = "router-secret"
    ca: Path | None = None

    @property
    def url(self) -> str:
        return f"rediss://router:{self.password}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"

    def start(self, ca: Path, cert: Path, key: Path) -> PrivateTlsRedis:
        self.port, self.ca = free_port(), ca
        acl = self.directory / "users.acl"
        acl.write_text(f"user default off\nuser router on >{self.password} ~sched:* &* +@all -@dangerous\n")
        process = self._spawn(_binary("redis-server"), "--port", "0", "--tls-port", str(self.port), "--bind",
                              "127.0.0.1", "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                              "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--aclfile", str(acl),
                              "--save", "", "--appendonly", "no", "--dir", str(self.directory))
        deadline = time.monotonic() + 15
        while True:
            try:
                with redis.Redis(port=self.port, ssl=True, ssl_ca_certs=str(ca), username="router",
                                 password=self.password, socket_timeout=0.5) as client:
                    if client.ping():
                        return self
            except (redis.ConnectionError, OSError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"TLS redis on port {self.port} did not start") from None
                time.sleep(0.05)
