"""Where a prefix is warm: the record a region publishes of the prefix keys its pools served
with prefix-cache hits, and the bounded tracker it keeps them in.

A region gateway sees each request's prefix key (``x_scheduler.prefix_key``, which the
router sends) and, in the engine's final usage, ``prompt_tokens_details.cached_tokens``: the
prompt tokens vLLM served from its prefix cache. A request with cached tokens > 0 is a hit:
the key is warm on that pool, for about that many tokens. The region publishes, per pool, the
keys it saw hit most recently (at most ``max_keys`` per pool) under
``keys.prefix_warm(region)`` with a TTL, as one JSON object:

    {"region": "eu-north", "observed_at": 1767225600.0,
     "pools": {"h200-long": {"auto:1f...": [384, 1767225599.2], ...}, ...}}

(per key: the cached tokens of its latest hit and when it was). The router's refresher reads
it off the request path (scheduler.datalayer.refresher); a hit older than the policy's
``max_age.prefix_cache`` is dropped, never used.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.types import WarmPrefix

# Keys kept per pool: the most recently hit (an engine's cache holds a few hundred prefixes
# of a few thousand tokens at most; older ones are evicted there first as well).
MAX_KEYS_PER_POOL = 256
MAX_KEY_CHARS = 256


@dataclass
class PrefixHits:
    """Per pool, the prefix keys served with cache hits, most recent last (bounded)."""

    max_keys: int = MAX_KEYS_PER_POOL
    _pools: dict[str, OrderedDict[str, tuple[int, float]]] = field(default_factory=dict)
    changed: bool = field(default=False, init=False)

    def record(self, pool: str, prefix_key: object, cached_tokens: int | None, at: float) -> None:
        """One finished request: a hit (cached tokens > 0) with a usable key is kept."""
        if not isinstance(prefix_key, str) or not prefix_key or len(prefix_key) > MAX_KEY_CHARS:
            return
        if cached_tokens is None or cached_tokens <= 0:
            return
        keys = self._pools.setdefault(pool, OrderedDict())
        keys[prefix_key] = (int(cached_tokens), at)
        keys.move_to_end(prefix_key)
        while len(keys) > self.max_keys:
            keys.popitem(last=False)
        self.changed = True

    def pools(self) -> dict[str, dict[str, tuple[int, float]]]:
        return {pool: dict(keys) for pool, keys in self._pools.items() if keys}


def encode(region: str, observed_at: float, pools: Mapping[str, Mapping[str, tuple[int, float]]]) -> bytes:
    return json.dumps({
        "region": region, "observed_at": observed_at,
        "pools": {pool: {key: [tokens, at] for key, (tokens, at) in keys.items()} for pool, keys in pools.items()},
    }, separators=(",", ":")).encode()


def decode(raw: bytes) -> tuple[str, list[tuple[str, WarmPrefix]]]:
    """(region, [(prefix key, where warm)]); ValueError when the record is malformed."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"prefix-warm record is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("region"), str) or not isinstance(data.get("pools"), dict):
        raise ValueError("prefix-warm record must be an object with a region and pools")
    region: str = data["region"]
    out: list[tuple[str, WarmPrefix]] = []
    for pool, entries in data["pools"].items():
        if not isinstance(entries, dict):
            raise ValueError(f"prefix-warm record: pools.{pool} must be an object")
        for key, value in entries.items():
            ok = (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int) and value[0] > 0
                  and isinstance(value[1], int | float) and math.isfinite(value[1]))
            if not ok or len(key) > MAX_KEY_CHARS:
                raise ValueError(f"prefix-warm record: pools.{pool}.{key[:40]}: expected [cached tokens, epoch s], "
                                 f"got {str(value)[:40]}")
            out.append((key, WarmPrefix(region, pool, value[0], float(value[1]))))
    return region, out
