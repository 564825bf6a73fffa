"""The config versions in the shared store (the keys are in the package's docstring): a version's
record (``PublishedConfig``), the pointer to the newest (``Head``), and ``ConfigStore``, which
reads, publishes and repairs them."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.server.config_reload.sources import ConfigBundle, ConfigVersion
from scheduler.server.config_signing import DIGEST_MISMATCH, MALFORMED, BundleRefused, BundleSignature
from scheduler.state.store import StateStore, StateUnavailable

log = logging.getLogger(__name__)

HEAD_KEY = "config:head"
KEEP_VERSIONS = 16
# Version records are pruned by the publishers (KEEP_VERSIONS), not by a TTL.
FOREVER_S = 10 * 365 * 86400.0
# A store record larger than this is not read as a bundle.
MAX_BUNDLE_BYTES = 16 * 2**20
MAX_CLAIMS = 64


def version_key(counter: int) -> str:
    return f"config:version:{counter}"


def digest_key(digest: str) -> str:
    return f"config:digest:{digest}"


def default_owner() -> str:
    """Who publishes: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class PublishedConfig:
    """One version as the store holds it."""

    counter: int
    bundle: ConfigBundle
    published_by: str
    published_at: float
    trigger: str
    # The operator's signature of the bundle (None: unsigned; adopted only where allowed).
    signature: BundleSignature | None = None

    @property
    def version(self) -> ConfigVersion:
        return ConfigVersion(self.counter, self.bundle.digest)

    @property
    def signed_at(self) -> float:
        return self.signature.signed_at if self.signature is not None else 0.0

    @property
    def fingerprint(self) -> str:
        """The bundle and its signature, whatever counter it was written under: one refusal
        is logged once however often the same record is written again."""
        signed = self.signature.value.hex() if self.signature is not None else "unsigned"
        return f"{self.bundle.digest}:{signed}"

    def to_bytes(self) -> bytes:
        return json.dumps({"counter": self.counter, "digest": self.bundle.digest, "bundle": self.bundle.to_dict(),
                           "published_by": self.published_by, "published_at": self.published_at,
                           "trigger": self.trigger,
                           "signature": self.signature.to_dict() if self.signature is not None else None},
                          ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> PublishedConfig:
        """``BundleRefused`` (a ValueError) when ``raw`` is not a version record (reason
        ``malformed``) or its hash does not match its files (``digest_mismatch``)."""
        if len(raw) > MAX_BUNDLE_BYTES:
            raise BundleRefused(MALFORMED, f"record of {len(raw):,} bytes, more than {MAX_BUNDLE_BYTES:,}")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleRefused(MALFORMED, f"not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("counter"), int) or data["counter"] < 1:
            raise BundleRefused(MALFORMED, "expected an object with a positive integer counter")
        try:
            bundle = ConfigBundle.from_dict(data.get("bundle"))
            signature = (None if data.get("signature") is None
                         else BundleSignature.from_dict(data["signature"], "signature"))
        except ValueError as exc:  # SigningError too
            raise BundleRefused(MALFORMED, str(exc)) from None
        if data.get("digest") != bundle.digest:
            raise BundleRefused(DIGEST_MISMATCH, f"the record's digest {str(data.get('digest'))[:16]!r} does not "
                                                   f"match its files' {bundle.digest[:16]}")
        at = data.get("published_at")
        return cls(data["counter"], bundle, str(data.get("published_by", "")),
                   float(at) if isinstance(at, int | float) else 0.0, str(data.get("trigger", "")), signature)


@dataclass(frozen=True)
class Head:
    counter: int
    digest: str

    def to_bytes(self) -> bytes:
        return json.dumps({"counter": self.counter, "digest": self.digest}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Head:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if (not isinstance(data, dict) or not isinstance(data.get("counter"), int)
                or not isinstance(data.get("digest"), str)):
            raise ValueError(f"expected {{counter, digest}}, got {str(data)[:80]}")
        return cls(data["counter"], data["digest"])


def _log_refused(key: str, refused: BundleRefused, fingerprint: str) -> None:
    log.warning("ignoring config record %s (%s): %s", key, refused.reason, refused.message)


@dataclass
class ConfigStore:
    """The versions in the shared store (any ``StateStore``; every call may raise
    ``StateUnavailable``). Records that do not parse are skipped and reported once each to
    ``refused`` (key, why, a fingerprint of the record)."""

    store: StateStore
    refused: Callable[[str, BundleRefused, str], None] = _log_refused
    _bad: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def _skip(self, key: str, raw: bytes, refused: BundleRefused) -> None:
        fingerprint = hashlib.sha256(raw).hexdigest()
        if self._bad.get(key) != fingerprint:
            self.refused(key, refused, fingerprint)
        self._bad[key] = fingerprint

    def _decode(self, key: str, raw: bytes | None) -> PublishedConfig | None:
        if raw is None:
            return None
        try:
            record = PublishedConfig.from_bytes(raw)
        except BundleRefused as exc:
            self._skip(key, raw, exc)
            return None
        self._bad.pop(key, None)
        return record

    def _head(self, raw: bytes | None) -> Head | None:
        if raw is None:
            return None
        try:
            return Head.from_bytes(raw)
        except ValueError as exc:
            self._skip(HEAD_KEY, raw, BundleRefused(MALFORMED, str(exc)))
            return None

    async def head(self) -> Head | None:
        return self._head(await self.store.get(HEAD_KEY))

    async def get(self, counter: int) -> PublishedConfig | None:
        key = version_key(counter)
        return self._decode(key, await self.store.get(key))

    async def newest(self, known: int) -> tuple[Head | None, PublishedConfig | None]:
        """The head, and the newest version after ``known`` (None: none newer). One read in
        the common case (nothing new): the head and version ``known + 1``."""
        raw_head, raw_next = await self.store.mget([HEAD_KEY, version_key(known + 1)])
        head = self._head(raw_head)
        best = self._decode(version_key(known + 1), raw_next)
        if head is not None and head.counter > max(known, best.counter if best else 0):
            best = await self.get(head.counter) or best
        if best is None:
            return head, None
        # A head two racing publishers left behind: walk on to the last version claimed.
        for _ in range(KEEP_VERSIONS):
            after = await self.get(best.counter + 1)
            if after is None:
                break
            best = after
        return head, best

    async def published_before(self, digest: str) -> bool:
        return await self.store.get(digest_key(digest)) is not None

    async def publish(self, bundle: ConfigBundle, after: int, by: str, at: float, trigger: str,
                      signature: BundleSignature | None = None) -> PublishedConfig:
        """Claim the next counter (after the head's and ``after``) for ``bundle`` and move the head."""
        head = await self.head()
        counter = max(after, head.counter if head is not None else 0) + 1
        for _ in range(MAX_CLAIMS):
            record = PublishedConfig(counter, bundle, by, at, trigger, signature)
            if await self.store.set_nx(version_key(counter), record.to_bytes(), FOREVER_S):
                break
            counter += 1
        else:
            raise StateUnavailable(f"could not claim a config version after {MAX_CLAIMS} tries (counter {counter})")
        await self.store.set(HEAD_KEY, Head(counter, bundle.digest).to_bytes())
        await self.store.set_nx(digest_key(bundle.digest), str(counter).encode(), FOREVER_S)
        if counter > KEEP_VERSIONS:
            await self.store.delete(version_key(counter - KEEP_VERSIONS))
        return record

    async def repair(self, record: PublishedConfig) -> None:
        """Put ``record`` back as the head (the store lost it, or a racing publisher left the
        head behind it)."""
        await self.store.set_nx(version_key(record.counter), record.to_bytes(), FOREVER_S)
        await self.store.set(HEAD_KEY, Head(record.counter, record.bundle.digest).to_bytes())
        await self.store.set_nx(digest_key(record.bundle.digest), str(record.counter).encode(), FOREVER_S)
