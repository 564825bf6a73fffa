"""A redis-server of the test's own on a free port, that a test can restart."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OwnRedis:
    """A redis-server process on a free port, persisted only on a graceful shutdown so a
    restart keeps what was written before it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--save", "", "--appendonly", "no", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.folder), "--dbfilename", "dump.rdb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def shutdown_saving(self) -> None:
        """A maintenance restart's first half: hold writes, save, exit. Writes held by the
        pause never run, so no client sees a write applied without its reply."""
        assert self.process is not None
        with redis.Redis(port=self.port, socket_timeout=2) as client:
            client.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
            # The server closes the connection as it exits.
            with contextlib.suppress(redis.ConnectionError):
                client.execute_command("SHUTDOWN", "SAVE")
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
