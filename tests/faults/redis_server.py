"""A private ``redis-server`` child process for tests that kill, restart or slow the store
(the shared server at 127.0.0.1:6379 is never touched). Append-only file on, fsync always, so
a restart on the same port comes back with what was written (as a production Redis with
persistence does); ``DEBUG`` is enabled for ``DEBUG SLEEP``. Stopped by its own handle."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PrivateRedis:
    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.directory), "--enable-debug-command", "local",
             "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    if client.ping():
                        return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-write, as a crashed node does."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    async def stall(self, seconds: float) -> None:
        """``DEBUG SLEEP`` from a ``redis-cli`` child: the server answers nothing for ``seconds``
        (a stalled store); returns when it answers again, at most ``seconds`` + 10 s later."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (apt-get install redis-tools)")
        process = await asyncio.create_subprocess_exec(
            cli, "-p", str(self.port), "DEBUG", "SLEEP", str(seconds),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            await asyncio.wait_for(process.wait(), seconds + 10)
        finally:
            if process.returncode is None:
                process.kill()  # our own child, by its handle
                await process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
