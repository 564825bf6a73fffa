"""Signed config bundles: an operator's Ed25519 key signs a bundle, routers check it with the
public keys they trust before they adopt it from the state store.

Whoever can write the router's Redis keys could otherwise publish a config version (add an
admin key, point a region at any host); a signature makes the store a carrier, not an authority.

What is signed: the bundle's content hash (``ConfigBundle.digest``, sha256 over every file's name
and text), the signing key's id and the time of signing, as

    b"carbon-scheduler config bundle v1\\n" + JSON {"digest", "key_id", "signed_at"} (sorted keys, no spaces)

A signature travels as an object ``{key_id, digest, signed_at, signature: <base64, 64 bytes>}``:
inside a version record in the store, or in a file of its own beside the config files (a
detached signature, ``scheduler config sign``; the router's ``--config-signature``).

The files (docs/hot-reload.md "Signed versions"):

- the private key (``scheduler config keygen``; keep it in a secret manager, never on a router)::

      key_id: ops-1
      private_key: <base64 of the 32-byte Ed25519 seed>

  read from the file ``--signing-key`` or ``$SCHEDULER_CONFIG_SIGNING_KEY_FILE`` names, or from
  ``$SCHEDULER_CONFIG_SIGNING_KEY`` (the file's content), never from a command-line value;
- the trusted public keys (the router's ``--config-trust``, or ``$SCHEDULER_CONFIG_TRUST_FILE``)::

      keys:
        ops-1: <base64 of the 32-byte public key>
        ops-2: <another; any key listed verifies, which is how keys rotate>

Checks, in order, each with the reason ``scheduler_config_rejected_total{reason}`` counts:
``unsigned`` (no signature, and unsigned bundles are not allowed), ``unknown_key`` (a key id
not in the trusted set), ``digest_mismatch`` (the signature or the record names another hash
than the files'), ``bad_signature`` (the signature does not verify). The reloader adds
``malformed`` (a record that does not parse), ``rollback`` (signed before the version in use)
and ``invalid`` (the files fail validation).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PURPOSE = b"carbon-scheduler config bundle v1\n"
SIGNING_KEY_ENV = "SCHEDULER_CONFIG_SIGNING_KEY"
SIGNING_KEY_FILE_ENV = "SCHEDULER_CONFIG_SIGNING_KEY_FILE"
TRUST_FILE_ENV = "SCHEDULER_CONFIG_TRUST_FILE"
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A signature file or record field larger than this is not read.
MAX_SIGNATURE_BYTES = 4096

# Why a bundle is refused (the label of scheduler_config_rejected_total).
UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown_key"
DIGEST_MISMATCH = "digest_mismatch"
BAD_SIGNATURE = "bad_signature"
MALFORMED = "malformed"
ROLLBACK = "rollback"
INVALID = "invalid"
SIGNATURE_REASONS = (UNSIGNED, UNKNOWN_KEY, DIGEST_MISMATCH, BAD_SIGNATURE, MALFORMED, ROLLBACK)


class SigningError(ValueError):
    """A key file, trust file or signature file that cannot be used; the message names the
    file and the field."""


class BundleRefused(ValueError):
    """A bundle from the store that this router will not adopt, and why (``reason``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _b64decode(text: object, where: str, length: int) -> bytes:
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise SigningError(f"{where}: not base64") from None
    if len(raw) != length:
        raise SigningError(f"{where}: expected {length} bytes, got {len(raw)}")
    return raw


def _key_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not KEY_ID.match(value):
        raise SigningError(f"{where}: expected a key id of letters, digits, '_', '.', '-' "
                           f"(at most 64), got {str(value)[:80]!r}")
    return value


@dataclass(frozen=True)
class BundleSignature:
    key_id: str
    digest: str
    # Unix seconds (milliseconds kept) when it was signed: a router refuses a version signed
    # before the one it runs (a replayed old version).
    signed_at: float
    value: bytes

    def message(self) -> bytes:
        claims = {"digest": self.digest, "key_id": self.key_id, "signed_at": self.signed_at}
        return PURPOSE + json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()

    def to_dict(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "digest": self.digest, "signed_at": self.signed_at,
                "signature": base64.b64encode(self.value).decode()}

    @classmethod
    def from_dict(cls, data: object, source: str) -> BundleSignature:
        """``SigningError`` naming ``source`` and the field when ``data`` is not a signature."""
        if not isinstance(data, dict) or set(data) != {"key_id", "digest", "signed_at", "signature"}:
            raise SigningError(f"{source}: expected an object with key_id, digest, signed_at and signature")
        key_id = _key_id(data["key_id"], f"{source}: key_id")
        digest = data["digest"]
        if not isinstance(digest, str) or not DIGEST.match(digest):
            raise SigningError(f"{source}: digest: expected 64 hex digits (sha256), got {str(digest)[:80]!r}")
        signed_at = data["signed_at"]
        if isinstance(signed_at, bool) or not isinstance(signed_at, int | float) or not signed_at > 0:
            raise SigningError(f"{source}: signed_at: expected unix seconds, got {str(signed_at)[:40]!r}")
        value = _b64decode(data["signature"], f"{source}: signature", 64)
        return cls(key_id, digest, float(signed_at), value)

    def to_text(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> BundleSignature:
        try:
            raw = path.read_bytes()[: MAX_SIGNATURE_BYTES + 1]
        except OSError as exc:
            raise SigningError(f"{path}: cannot read the signature: {exc.strerror or exc}") from None
        if len(raw) > MAX_SIGNATURE_BYTES:
            raise SigningError(f"{path}: more than {MAX_SIGNATURE_BYTES} bytes: not a signature")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SigningError(f"{path}: not JSON: {exc}") from None
        return cls.from_dict(data, str(path))


@dataclass(frozen=True)
class SigningKey:
    """An operator's private key (only ``scheduler config sign|publish`` hold one)."""

    key_id: str
    private: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls, key_id: str) -> SigningKey:
        return cls(_key_id(key_id, "--kid"), Ed25519PrivateKey.generate())

    def public_b64(self) -> str:
        return base64.b64encode(self.private.public_key().public_bytes_raw()).decode()

    def to_text(self) -> str:
        seed = base64.b64encode(self.private.private_bytes_raw()).decode()
        return (f"# carbon-scheduler config signing key {self.key_id}: keep it secret (docs/hot-reload.md).\n"
                f"key_id: {self.key_id}\nprivate_key: {seed}\n")

    @classmethod
    def parse(cls, text: str, source: str) -> SigningKey:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            # The parser's message would quote the text: the private key.
            raise SigningError(f"{source}: not YAML") from None
        if not isinstance(data, dict) or set(data) != {"key_id", "private_key"}:
            raise SigningError(f"{source}: expected a mapping with key_id and private_key "
                               "(`scheduler config keygen` writes one)")
        key_id = _key_id(data["key_id"], f"{source}: key_id")
        seed = _b64decode(data["private_key"], f"{source}: private_key", 32)
        return cls(key_id, Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SigningError(f"{path}: cannot read the signing key: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.parse(text, str(path))

    @classmethod
    def from_env_or_file(cls, path: Path | None) -> SigningKey:
        """The key in ``path`` (``--signing-key``), else ``$SCHEDULER_CONFIG_SIGNING_KEY``
        (the content), else the file ``$SCHEDULER_CONFIG_SIGNING_KEY_FILE`` names."""
        if path is not None:
            return cls.load(path)
        text = os.environ.get(SIGNING_KEY_ENV)
        if text:
            return cls.parse(text, f"${SIGNING_KEY_ENV}")
        named = os.environ.get(SIGNING_KEY_FILE_ENV)
        if named:
            return cls.load(Path(named))
        raise SigningError(f"no signing key: pass --signing-key FILE, or set ${SIGNING_KEY_FILE_ENV} (a file) or "
                           f"${SIGNING_KEY_ENV} (its content); make one with `scheduler config keygen`")

    def sign(self, digest: str, at: float) -> BundleSignature:
        unsigned = BundleSignature(self.key_id, digest, round(at, 3), b"")
        return BundleSignature(self.key_id, digest, unsigned.signed_at, self.private.sign(unsigned.message()))


@dataclass(frozen=True)
class ConfigTrust:
    """The public keys a router accepts bundles from, and whether it accepts unsigned ones.

    No key and no ``allow_unsigned`` (the default): the router adopts nothing from the store and
    publishes nothing (it runs on its own files)."""

    keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    allow_unsigned: bool = False
    # Where the keys came from, for messages.
    source: str = "--config-trust"

    @property
    def standalone(self) -> bool:
        """Neither a key nor unsigned bundles: versions are neither adopted nor published."""
        return not self.keys and not self.allow_unsigned

    @classmethod
    def parse(cls, text: str, source: str, allow_unsigned: bool = False) -> ConfigTrust:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SigningError(f"{source}: not YAML: {exc}") from None
        if not isinstance(data, dict) or set(data) != {"keys"} or not isinstance(data["keys"], dict):
            raise SigningError(f"{source}: expected a mapping with one key, 'keys' (key id -> base64 public key)")
        if not data["keys"]:
            raise SigningError(f"{source}: keys: the list is empty (no bundle could be adopted); "
                               "add a key with `scheduler config keygen --trust FILE`")
        keys = {}
        for kid, value in data["keys"].items():
            key_id = _key_id(kid, f"{source}: keys")
            keys[key_id] = Ed25519PublicKey.from_public_bytes(_b64decode(value, f"{source}: keys.{key_id}", 32))
        return cls(keys, allow_unsigned, source)

    @classmethod
    def load(cls, path: Path, allow_unsigned: bool = False) -> ConfigTrust:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SigningError(f"{path}: cannot read the trusted keys: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.parse(text, str(path), allow_unsigned)

    def check(self, digest: str, signature: BundleSignature | None) -> None:
        """``BundleRefused`` unless the bundle with content hash ``digest`` may be adopted."""
        if signature is None:
            if self.allow_unsigned:
                return
            if not self.keys:
                raise BundleRefused(UNSIGNED, "not signed, and this router trusts no config key (no --config-trust): "
                                              "it adopts no version from the store")
            raise BundleRefused(UNSIGNED, f"not signed; this router adopts only versions signed by a key in "
                                          f"{self.source} ({', '.join(sorted(self.keys))})")
        public = self.keys.get(signature.key_id)
        if public is None:
            trusted = ", ".join(sorted(self.keys)) or "none"
            raise BundleRefused(UNKNOWN_KEY, f"signed by key {signature.key_id!r}, which this router does not trust "
                                             f"({self.source} has: {trusted})")
        if signature.digest != digest:
            raise BundleRefused(DIGEST_MISMATCH, f"the signature is for bundle {signature.digest[:12]}, "
                                                 f"these files are {digest[:12]}")
        try:
            public.verify(signature.value, signature.message())
        except InvalidSignature:
            raise BundleRefused(BAD_SIGNATURE, f"the signature of key {signature.key_id!r} does not verify "
                                               "(the files or the signature were altered)") from None


def trust_entry(key: SigningKey) -> str:
    """The trust file's line for ``key`` (its public half)."""
    return yaml.safe_dump({"keys": {key.key_id: key.public_b64()}}, sort_keys=False)
