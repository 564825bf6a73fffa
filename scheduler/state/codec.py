"""JSON encoding of the typed values kept in the store (region live state, signals).

Decoding is strict: a record that does not have the expected fields raises ``ValueError``
naming what is wrong, and the reader logs it and treats the value as missing (never as a
made-up default).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from scheduler.types import ModelReplicas, PoolLiveState, RegionLiveState, Signal

_SIGNAL_FIELDS = {f.name for f in fields(Signal)}
_POOL_FIELDS = {f.name for f in fields(PoolLiveState)}


def encode_signal(signal: Signal) -> bytes:
    return json.dumps(asdict(signal), separators=(",", ":")).encode()


def decode_signal(raw: bytes | str) -> Signal:
    data = _object(raw, "signal")
    missing = {"kind", "key", "value", "unit", "observed_at", "fetched_at", "source"} - data.keys()
    if missing:
        raise ValueError(f"signal record lacks {sorted(missing)}")
    unknown = data.keys() - _SIGNAL_FIELDS
    if unknown:
        raise ValueError(f"signal record has unknown fields {sorted(unknown)}")
    for name in ("value", "observed_at", "fetched_at"):
        if not isinstance(data[name], int | float) or isinstance(data[name], bool):
            raise ValueError(f"signal field {name} must be a number, got {data[name]!r}")
    return Signal(**data)


def encode_region_state(state: RegionLiveState) -> bytes:
    body = {
        "region": state.region,
        "healthy": state.healthy,
        "observed_at": state.observed_at,
        "pools": {name: asdict(pool) for name, pool in state.pools.items()},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_region_state(raw: bytes | str) -> RegionLiveState:
    data = _object(raw, "region state")
    try:
        region, healthy, observed_at, pools = data["region"], data["healthy"], data["observed_at"], data["pools"]
    except KeyError as exc:
        raise ValueError(f"region state record lacks {exc.args[0]!r}") from None
    if not isinstance(healthy, bool) or not isinstance(observed_at, int | float) or not isinstance(pools, dict):
        raise ValueError("region state record has mistyped healthy/observed_at/pools")
    decoded = {}
    for name, pool in pools.items():
        if not isinstance(pool, dict) or pool.keys() - _POOL_FIELDS:
            raise ValueError(f"region state pool {name!r} is malformed: {pool!r}")
        models = pool.get("models")
        if models is not None and not (isinstance(models, dict) and all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in models.values())):
            raise ValueError(f"region state pool {name!r}: models must map model names to context limits, "
                             f"got {models!r}")
        decoded[name] = PoolLiveState(**{**pool, "model_replicas": _model_replicas(name, pool.get("model_replicas"))})
    return RegionLiveState(region=str(region), healthy=healthy, observed_at=float(observed_at), pools=decoded)


def _model_replicas(pool: str, raw: object) -> dict[str, ModelReplicas] | None:
    """A pool's ``model_replicas``: model -> {replicas, starting_replicas}, counts >= 0."""
    if raw is None:
        return None
    counts = ("replicas", "starting_replicas")
    if not (isinstance(raw, dict) and all(
            isinstance(entry, dict) and entry.keys() == set(counts)
            and all(isinstance(entry[c], int) and not isinstance(entry[c], bool) and entry[c] >= 0 for c in counts)
            for entry in raw.values())):
        raise ValueError(f"region state pool {pool!r}: model_replicas must map model names to "
                         f"{{replicas, starting_replicas}} counts, got {raw!r}")
    return {model: ModelReplicas(**entry) for model, entry in raw.items()}


def _object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} record is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} record is not a JSON object")
    return data
