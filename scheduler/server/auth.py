"""Tenant API keys, the admin role and per-tenant request rates.

A key reads ``sk-<id>.<secret>``; the keys file stores, per key, its public ``id``, tenant,
role, a random salt and ``sha256(salt + secret)``, never the key itself
(``scheduler keys create`` prints a new key once, and the entry to add). Clients send it as
``authorization: Bearer <key>``. Checking a key is one dict lookup and one hash.

A key may carry limits for its tenant (``rate_limit_rps``, ``max_concurrent_streams``) and bind
it to jurisdictions (``jurisdictions: [EU]``): ``scope_jurisdictions`` intersects a request's
allowed jurisdictions with the key's. ``TenantRateLimiter`` is the per-process token bucket;
``scheduler.server.rate_limit`` shares a tenant's rate among routers through the store and
falls back to this one when the store is unreachable.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field

from scheduler import errors
from scheduler.config.loader import ConfigIssue, parse, validate
from scheduler.config.schema import Strict

KEY_PREFIX = "sk-"
Role = Literal["tenant", "admin"]


class ApiKeyEntry(Strict):
    id: str = Field(pattern=r"^[0-9a-f]{8,32}$")
    tenant: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    role: Role = "tenant"
    salt: str = Field(pattern=r"^[0-9a-f]{16,128}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # Requests per second this key's tenant may send to one router; default: the router's.
    rate_limit_rps: float | None = Field(default=None, gt=0)
    # Generate streams this key's tenant may hold open at once on one router; default: the router's.
    max_concurrent_streams: int | None = Field(default=None, gt=0)
    # The only jurisdictions this key's requests may run in (unset: any the request allows).
    jurisdictions: tuple[Annotated[str, Field(pattern=r"^[A-Z]{2,8}$")], ...] | None = Field(
        default=None, min_length=1)


class KeysFile(Strict):
    keys: tuple[ApiKeyEntry, ...] = ()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant of the key and whether it may use ``RouterAdmin``."""

    tenant: str
    admin: bool
    key_id: str = ""
    rate_limit_rps: float | None = None
    max_concurrent_streams: int | None = None
    jurisdictions: tuple[str, ...] = ()


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    key: str
    entry: ApiKeyEntry

    def entry_yaml(self) -> str:
        return yaml.safe_dump([self.entry_dict()], sort_keys=False)

    def entry_dict(self) -> dict[str, object]:
        """The entry as the keys file holds it (unset limits left out)."""
        data: dict[str, object] = self.entry.model_dump(mode="json", exclude_none=True)
        return data


def create_key(tenant: str, admin: bool = False, rate_limit_rps: float | None = None,
               max_concurrent_streams: int | None = None, jurisdictions: Sequence[str] = ()) -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    entry = ApiKeyEntry(id=key_id, tenant=tenant, role="admin" if admin else "tenant", salt=salt,
                        sha256=_digest(salt, secret), rate_limit_rps=rate_limit_rps,
                        max_concurrent_streams=max_concurrent_streams, jurisdictions=tuple(jurisdictions) or None)
    return NewKey(key=f"{KEY_PREFIX}{key_id}.{secret}", entry=entry)


@dataclass(frozen=True)
class KeyRing:
    """The known keys by id."""

    entries: Mapping[str, ApiKeyEntry]

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        """Read a keys file; errors (``ConfigError``) name the file, the field and the value."""
        keys_file = validate(KeysFile, parse(path), str(path))
        return cls.of(keys_file.keys)

    @classmethod
    def of(cls, entries: Sequence[ApiKeyEntry]) -> KeyRing:
        return cls({entry.id: entry for entry in entries})

    @property
    def has_admin(self) -> bool:
        return any(entry.role == "admin" for entry in self.entries.values())

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an ``authorization`` header value; ``Unauthenticated`` otherwise."""
        if not authorization:
            raise errors.Unauthenticated("missing 'authorization: Bearer <key>' metadata")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(KEY_PREFIX):
            raise errors.Unauthenticated("authorization must be 'Bearer sk-<id>.<secret>'")
        key_id, _, secret = token[len(KEY_PREFIX):].partition(".")
        entry = self.entries.get(key_id)
        if entry is None or not hmac.compare_digest(_digest(entry.salt, secret), entry.sha256):
            raise errors.Unauthenticated("unknown API key")
        return Principal(tenant=entry.tenant, admin=entry.role == "admin", key_id=entry.id,
                         rate_limit_rps=entry.rate_limit_rps, max_concurrent_streams=entry.max_concurrent_streams,
                         jurisdictions=entry.jurisdictions or ())


def key_ring_issues(ring: KeyRing, file: str, replacing: KeyRing | None = None) -> list[ConfigIssue]:
    """Why ``ring`` cannot be a router's whole key ring: an empty list (every call would be
    refused), or, when it replaces ``replacing`` which has an admin key, no admin key left
    (nobody could reload the config, flip the kill switch or read the status)."""
    if not ring.entries:
        return [ConfigIssue(file, "keys", "the list is empty: every call would be refused (UNAUTHENTICATED); "
                                          "a router without keys runs with --insecure, never with an empty file")]
    if replacing is not None and replacing.has_admin and not ring.has_admin:
        return [ConfigIssue(file, "keys", f"no key has role admin, and the keys in use have "
                                          f"{sum(e.role == 'admin' for e in replacing.entries.values())}: this version "
                                          "would leave nobody able to reload the config or use RouterAdmin "
                                          "(keep one: `scheduler keys create --tenant ops --admin --append FILE`)")]
    return []


def scope_jurisdictions(principal: Principal, requested: Sequence[str]) -> tuple[str, ...]:
    """The jurisdictions a request may run in under ``principal``'s key: the request's list
    intersected with the key's (an empty request list: the key's list; a key without a list:
    the request's). ``PermissionDenied`` naming them when the request allows only others."""
    bound = principal.jurisdictions
    if not bound:
        return tuple(requested)
    if not requested:
        return bound
    kept = tuple(code for code in requested if code in bound)
    if not kept:
        outside = ", ".join(sorted(set(requested)))
        raise errors.PermissionDenied(
            f"the key of tenant {principal.tenant!r} may only run in {', '.join(bound)}; "
            f"the request allows only {outside}")
    return kept


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class TenantRateLimiter:
    """Token bucket per tenant: ``rate_rps`` sustained, bursts up to ``burst_s`` seconds' worth."""

    default_rps: float = 50.0
    burst_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict, init=False, repr=False)

    def check(self, principal: Principal) -> None:
        """Take one token for the tenant, or raise ``RateLimited`` with when to retry."""
        rate = principal.rate_limit_rps or self.default_rps
        capacity = max(1.0, rate * self.burst_s)
        now = self.clock()
        bucket = self._buckets.get(principal.tenant)
        if bucket is None:
            bucket = self._buckets[principal.tenant] = _Bucket(tokens=capacity, updated=now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens < 1.0:
            raise errors.RateLimited(principal.tenant, rate, retry_after_s=(1.0 - bucket.tokens) / rate)
        bucket.tokens -= 1.0
