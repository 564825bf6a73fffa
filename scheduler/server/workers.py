"""``scheduler router --workers N``: N router processes on the same ports.

One Python process uses one core, and the router's work per stream is CPU; a pod with more
cores runs one worker per core. The parent starts N children, each the same ``scheduler
router`` command with ``--worker-index i`` (they bind the gRPC and HTTP ports with
SO_REUSEPORT, so the kernel spreads connections over them), forwards SIGTERM/SIGINT to them
(and SIGHUP, the config reload: each worker reloads, and they share one config version through
the store, docs/hot-reload.md) and waits; a worker that dies is started again after a
back-off, and if workers keep dying (``MAX_RESTARTS`` in ``RESTART_WINDOW_S``) the parent
stops them all and exits 1, so the orchestrator restarts the pod instead of a crash loop
going unseen.

What the workers share goes through the state store (it must be Redis): region state and
carbon signals (each refreshes its own snapshot from it; one of them polls each provider
and zone, by lock), the ledger, the audit stream, the kill switch, rate limits. What each
counts alone: its own pending dispatches (load it sent since a region last published), the
per-tenant stream cap (a tenant may hold N times ``--max-streams-per-tenant`` in the pod),
and its scrape-time gauges.

Metrics: the parent makes a directory for prometheus_client's multiprocess mode and hands it
to the workers in ``PROMETHEUS_MULTIPROC_DIR`` (an operator's own value is used instead, and its
old files removed); each worker writes its counters and histograms there and serves
``/metrics`` on the one ``--metrics-port`` (SO_REUSEPORT), answering with every worker's sum
(the counters its parts report at scrape time too, which each writes there every second) and
its own gauges. A worker that dies is marked dead (its live gauges leave the sum; its
counts stay); the parent removes the directory (or empties the operator's) when it exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from scheduler.server.metrics import SCRAPE_FILE_PREFIX

log = logging.getLogger(__name__)

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
BACKOFF_S = 1.0
# prometheus_client's multiprocess mode: where each process writes its counters.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def metrics_directory(environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The workers' metrics directory and whether this process made it (and so removes it):
    the operator's ``PROMETHEUS_MULTIPROC_DIR`` emptied of a previous run's files, else a new
    temporary one."""
    given = environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        clear_metrics_directory(path)
        return path, False
    return Path(tempfile.mkdtemp(prefix="scheduler-metrics-")), True


def clear_metrics_directory(path: Path) -> None:
    """prometheus_client's files and the workers' scrape-time counters (scheduler.server.metrics)."""
    for pattern in ("*.db", f"{SCRAPE_FILE_PREFIX}*.json", f"{SCRAPE_FILE_PREFIX}*.tmp"):
        for stale in path.glob(pattern):
            stale.unlink(missing_ok=True)


def worker_argv(argv: Sequence[str], index: int) -> list[str]:
    """The child's command line: the parent's, with ``--workers`` dropped and its index added."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return [sys.executable, "-m", "scheduler.cli", *out, "--worker-index", str(index)]


@dataclass
class Supervisor:
    argv: Sequence[str]
    workers: int
    grace_s: float = 10.0
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _metrics_dir: Path | None = field(default=None, init=False)
    _restarts: list[float] = field(default_factory=list, init=False)
    _stopping: bool = field(default=False, init=False)

    def _start(self, index: int) -> None:
        env = dict(os.environ)
        if self._metrics_dir is not None:
            env[MULTIPROC_ENV] = str(self._metrics_dir)
        self._children[index] = subprocess.Popen(worker_argv(self.argv, index), env=env)
        log.info("router worker %d started (pid %d)", index, self._children[index].pid)

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        self._metrics_dir, made = metrics_directory(os.environ)
        try:
            return self._run()
        finally:
            if made:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)
            else:
                clear_metrics_directory(self._metrics_dir)

    def _run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signal)
        signal.signal(signal.SIGHUP, self._forward)
        for index in range(self.workers):
            self._start(index)
        code = 0
        while not self._stopping:
            time.sleep(0.2)
            for index, child in list(self._children.items()):
                if child.poll() is None or self._stopping:
                    continue
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
                log.error("router worker %d (pid %d) exited with %s", index, child.pid, child.returncode)
                self._mark_dead(child.pid)
                if len(self._restarts) > MAX_RESTARTS:
                    log.error("%d worker restarts in %.0f s: stopping every worker", len(self._restarts),
                              RESTART_WINDOW_S)
                    self._signal(signal.SIGTERM, None)
                    code = 1
                    break
                time.sleep(BACKOFF_S)
                self._start(index)
        deadline = time.monotonic() + self.grace_s + 5.0
        for child in self._children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return code

    def _mark_dead(self, pid: int) -> None:
        """Drop a dead worker's live gauges from the sum (its counters keep counting)."""
        if self._metrics_dir is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self._metrics_dir))  # type: ignore[no-untyped-call]
