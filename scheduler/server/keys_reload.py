"""Reloading the tenant keys file without a restart, so a key can be added or revoked live.

``KeysReloader`` checks the file's identity (mtime, size, inode: a Kubernetes Secret update
swaps a symlink) every ``interval_s`` in the background, and ``reload()`` re-reads it at once
(e.g. on SIGHUP). A file that fails to load (missing, bad YAML, a bad field)
keeps the keys in use and logs every problem with its file, field and value; the next
change of the file is tried again. So does a file with an empty key list, or one without an
admin key while the keys in use have one (``auth.key_ring_issues``). A good file replaces the
whole key ring: a key no longer in it is refused from the next call on.

``scheduler router`` reloads its keys file with the rest of its config and shares the result
with the other routers (``scheduler.server.config_reload``, which follows this pattern); this
reloader is for a key ring embedded on its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.config.loader import ConfigError
from scheduler.server.auth import KeyRing, key_ring_issues
from scheduler.tasks import run_every, start_loop, stop_task

log = logging.getLogger(__name__)

Identity = tuple[int, int, int]


def _identity(path: Path) -> Identity | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


@dataclass
class KeysReloader:
    path: Path
    # Receives each good key ring (e.g. ``lambda ring: setattr(deps, "keys", ring)``).
    apply: Callable[[KeyRing], None]
    interval_s: float = 2.0
    # The ring in use (None: not known; then only an empty file is refused).
    current: KeyRing | None = None
    reloads: int = field(default=0, init=False)
    failures: int = field(default=0, init=False)
    _seen: Identity | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def reload(self) -> bool:
        """Re-read the file now; True if its keys are in use, False if the old ones stay."""
        self._seen = _identity(self.path)
        try:
            ring = KeyRing.load(self.path)
        except ConfigError as exc:
            self.failures += 1
            for issue in exc.issues:
                log.error("keys file not reloaded, the previous keys stay in use: %s", issue)
            return False
        except OSError as exc:
            self.failures += 1
            log.error("keys file not reloaded, the previous keys stay in use: %s: %s", self.path, exc)
            return False
        issues = key_ring_issues(ring, str(self.path), self.current)
        if issues:
            self.failures += 1
            for issue in issues:
                log.error("keys file not reloaded, the previous keys stay in use: %s", issue)
            return False
        self.apply(ring)
        self.current = ring
        self.reloads += 1
        log.warning("keys file %s reloaded: %d keys", self.path, len(ring.entries))
        return True

    async def start(self) -> None:
        self._seen = _identity(self.path)
        self._task = start_loop(self._watch, "keys-reload")

    async def stop(self) -> None:
        await stop_task(self._task)

    async def _watch(self) -> None:
        await run_every(self.interval_s, self._reload_if_changed, f"keys file {self.path}: watching",
                        first_after_s=self.interval_s)

    async def _reload_if_changed(self) -> None:
        if _identity(self.path) != self._seen:
            self.reload()
