"""Publishing where a region's prefixes are warm (``scheduler.state.prefix_warm``).

The gateway records each finished request's prefix key and the cached prompt tokens the
engine reported (``PrefixHits``); this loop writes the record under
``keys.prefix_warm(region)`` with a TTL whenever it changed, and at least once per TTL/3 while
any key is held (so a region that keeps serving keeps its record alive, and one that stops lets
it expire). A failing store only delays the next write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.state import keys, prefix_warm
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import run_every

log = logging.getLogger(__name__)


@dataclass
class PrefixWarmPublisher:
    region: str
    hits: prefix_warm.PrefixHits
    store: StateStore
    interval_s: float = 1.0
    ttl_s: float = 120.0
    clock: Callable[[], float] = time.time
    published: int = field(default=0, init=False)
    _last_at: float = field(default=float("-inf"), init=False)

    async def publish_once(self) -> bool:
        """Write the record if it changed or is a third of its TTL old; True if written."""
        now = self.clock()
        pools = self.hits.pools()
        if not pools or (not self.hits.changed and now - self._last_at < self.ttl_s / 3):
            return False
        self.hits.changed = False
        try:
            await self.store.set(keys.prefix_warm(self.region), prefix_warm.encode(self.region, now, pools),
                                 ttl_s=self.ttl_s)
        except StateUnavailable as exc:
            self.hits.changed = True
            log.debug("region %s: prefix-warm record not written: %s", self.region, exc)
            return False
        self._last_at = now
        self.published += 1
        return True

    async def run(self) -> None:
        await run_every(self.interval_s, self.publish_once, f"region {self.region}: publishing prefix warmth")
