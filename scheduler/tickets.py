"""Dispatch tickets: the router's decision, signed, so that a region runs only what was decided.

A ticket binds one dispatch: decision id, request id, tenant, region, pool, model,
``max_tokens``, a bound on the prompt's tokens, a SHA-256 digest of the prompt, the dispatch
mode (proxy: the router streams and writes the receipt; direct: the client streams and the
region writes the receipt) and an expiry at most ``MAX_TICKET_TTL_S`` ahead. It is signed with
HMAC-SHA256 under a secret of the target region, named by a key id so keys can rotate:

    v1.<kid>.<base64url(JSON claims)>.<base64url(HMAC(key, "ticket.v1.<kid>.<claims>"))>

Regions sign the receipts they write in direct mode with the same keys under another
purpose ("receipt"), so one can never pass for the other.

The key file (``scheduler tickets keygen``; a Kubernetes Secret in production) holds, per
region, the active key id and every key still accepted::

    regions:
      eu-north: {active: k2, keys: {k2: <base64 32 bytes>, k1: <older, accepted until removed>}}

The router loads every region; a region's gateway only its own entry. Either reads the file
``$SCHEDULER_TICKET_KEYS_FILE`` names (a mounted Kubernetes Secret) or the content itself
from ``$SCHEDULER_TICKET_KEYS``; the router also takes ``--ticket-keys FILE``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml

VERSION = "v1"
# A ticket is good for this long at most: a stolen one is useless soon after.
MAX_TICKET_TTL_S = 30.0
HEADER = "x-scheduler-ticket"
KEYS_FILE_ENV = "SCHEDULER_TICKET_KEYS_FILE"
# The key file's content itself, for platforms that inject secrets as variables.
KEYS_ENV = "SCHEDULER_TICKET_KEYS"
KEY_BYTES = 32
# No tokenizer's token is longer than this many UTF-8 bytes, so ceil(bytes / this) is a lower
# bound on a prompt's tokens that a gateway can check without loading the tokenizer.
MAX_TOKEN_BYTES = 128

Mode = Literal["proxy", "direct"]
Purpose = Literal["ticket", "receipt"]


class TicketKeysError(ValueError):
    """A ticket key file or entry that cannot be used; the message names file and field."""


class TicketRejected(Exception):
    """A region refuses a dispatch: ``status`` 401 (no valid ticket) or 403 (valid, but not
    for this request), ``reason`` says which check failed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RegionKeys:
    """One region's ticket keys: ``active`` signs, every key in ``keys`` verifies."""

    region: str
    active: str
    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if self.active not in self.keys:
            raise TicketKeysError(f"regions.{self.region}.active: key id {self.active!r} is not in keys")
        for kid, key in self.keys.items():
            if len(key) < 16:
                raise TicketKeysError(f"regions.{self.region}.keys.{kid}: a key needs at least 16 bytes, got {len(key)}")

    @classmethod
    def generate(cls, region: str, kid: str | None = None) -> RegionKeys:
        kid = kid or f"k{int(time.time())}"
        return cls(region, kid, {kid: secrets.token_bytes(KEY_BYTES)})

    def to_yaml_entry(self) -> dict[str, Any]:
        return {"active": self.active, "keys": {kid: base64.b64encode(key).decode() for kid, key in self.keys.items()}}


@dataclass(frozen=True)
class TicketKeyRing:
    regions: Mapping[str, RegionKeys] = field(default_factory=dict)

    def of(self, region: str) -> RegionKeys:
        try:
            return self.regions[region]
        except KeyError:
            raise TicketKeysError(f"no ticket keys for region {region!r} "
                                  f"(the key file has: {', '.join(sorted(self.regions)) or 'none'})") from None

    def only(self, region: str) -> TicketKeyRing:
        return TicketKeyRing({region: self.of(region)})

    @classmethod
    def generate(cls, regions: Iterable[str]) -> TicketKeyRing:
        return cls({name: RegionKeys.generate(name) for name in regions})

    def to_yaml(self) -> str:
        body = {"regions": {name: keys.to_yaml_entry() for name, keys in sorted(self.regions.items())}}
        return yaml.safe_dump(body, sort_keys=False)

    @classmethod
    def parse(cls, text: str, source: str) -> TicketKeyRing:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TicketKeysError(f"{source}: not YAML: {exc}") from None
        if not isinstance(data, dict) or set(data) != {"regions"} or not isinstance(data["regions"], dict):
            raise TicketKeysError(f"{source}: expected a mapping with one key, 'regions'")
        regions = {}
        for name, entry in data["regions"].items():
            where = f"{source}: regions.{name}"
            if not isinstance(entry, dict) or set(entry) != {"active", "keys"} or not isinstance(entry["keys"], dict):
                raise TicketKeysError(f"{where}: expected {{active: <key id>, keys: {{<key id>: <base64>}}}}")
            keys = {}
            for kid, value in entry["keys"].items():
                try:
                    keys[str(kid)] = base64.b64decode(str(value), validate=True)
                except (binascii.Error, ValueError):
                    raise TicketKeysError(f"{where}.keys.{kid}: not base64") from None
            try:
                regions[str(name)] = RegionKeys(str(name), str(entry["active"]), keys)
            except TicketKeysError as exc:
                raise TicketKeysError(f"{source}: {exc}") from None
        return cls(regions)

    @classmethod
    def load(cls, path: Path) -> TicketKeyRing:
        try:
            text = path.read_text()
        except OSError as exc:
            raise TicketKeysError(f"{path}: cannot read ticket keys: {exc.strerror}") from None
        return cls.parse(text, str(path))

    @classmethod
    def from_env(cls) -> TicketKeyRing | None:
        """The ring in ``$SCHEDULER_TICKET_KEYS`` (the file's content) or in the file
        ``$SCHEDULER_TICKET_KEYS_FILE`` names; None when neither is set."""
        text = os.environ.get(KEYS_ENV)
        if text:
            return cls.parse(text, f"${KEYS_ENV}")
        path = os.environ.get(KEYS_FILE_ENV)
        return cls.load(Path(path)) if path else None


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).translate(_URLSAFE).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(keys: RegionKeys, purpose: Purpose, claims: Mapping[str, Any]) -> str:
    return _signed(keys, purpose, orjson.dumps(claims, option=orjson.OPT_SORT_KEYS))


def _signed(keys: RegionKeys, purpose: Purpose, claims_json: bytes) -> str:
    # The one-shot hmac.digest: a router signs a ticket for every dispatch.
    body = _b64(claims_json)
    kid = keys.active
    mac = hmac.digest(keys.keys[kid], f"{purpose}.{VERSION}.{kid}.{body}".encode(), "sha256")
    return f"{VERSION}.{kid}.{body}.{_b64(mac)}"


class ClaimsSigner:
    """Signs several tickets that share most of their claims (one dispatch's candidates): the
    shared claims are serialised and base64-encoded once, each ticket adds its own (disjoint
    names). The same claims as ``sign`` would make of the merged ones, up to the order of the
    JSON keys and some whitespace, which the signature covers as sent and ``verify`` does not
    depend on.

    A ticket's claims are ``{`` + own members + ``,`` + spaces + shared members + ``}``, the
    spaces making the part before the shared members a whole number of 3-byte groups: the
    base64 of the whole is then the base64 of that part followed by the base64 of the rest,
    so both are encoded once (``own_part`` once per candidate and carbon signal, the rest
    once per dispatch) and a ticket costs its HMAC alone."""

    def __init__(self, purpose: Purpose, shared: Mapping[str, Any]) -> None:
        self.purpose = purpose
        self._names = frozenset(shared)
        # The object's members without its braces, to splice after each ticket's own.
        self._shared = orjson.dumps(shared)[1:-1]
        self._tail = _b64(self._shared + b"}") if self._shared else ""

    def own_part(self, own: Mapping[str, Any]) -> str:
        """The base64 of ``{`` + ``own``'s members + ``,``, padded with spaces to a multiple of
        3 bytes (``sign_part`` completes it); the same for every signer with these shared names."""
        if not own.keys().isdisjoint(self._names):
            raise ValueError(f"claims {sorted(self._names.intersection(own))} are both shared and own")
        head = b"{" + orjson.dumps(own)[1:-1] + b","
        return _b64(head + b" " * (-len(head) % 3))

    def sign_part(self, keys: RegionKeys, own_part: str) -> str:
        """The ticket of a non-empty own part (``own_part``) and the shared claims."""
        if not self._shared:
            raise ValueError("sign_part needs shared claims: use sign")
        body = own_part + self._tail
        kid = keys.active
        mac = hmac.digest(keys.keys[kid], f"{self.purpose}.{VERSION}.{kid}.{body}".encode(), "sha256")
        return f"{VERSION}.{kid}.{body}.{_b64(mac)}"

    def sign(self, keys: RegionKeys, own: Mapping[str, Any]) -> str:
        if own and self._shared:
            return self.sign_part(keys, self.own_part(own))
        if not own.keys().isdisjoint(self._names):
            raise ValueError(f"claims {sorted(self._names.intersection(own))} are both shared and own")
        members = orjson.dumps(own)[1:-1]
        return _signed(keys, self.purpose, b"{" + (members or self._shared) + b"}")


def verify(keys: RegionKeys, purpose: Purpose, token: str) -> dict[str, Any]:
    """The claims of a token signed with one of ``keys``; ``TicketRejected(401)`` otherwise."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION:
        raise TicketRejected(401, f"malformed {purpose}: expected {VERSION}.<kid>.<claims>.<signature>")
    _, kid, body, mac = parts
    key = keys.keys.get(kid)
    if key is None:
        raise TicketRejected(401, f"{purpose} signed with unknown key id {kid!r} for region {keys.region}")
    expected = hmac.digest(key, f"{purpose}.{VERSION}.{kid}.{body}".encode(), "sha256")
    try:
        valid = hmac.compare_digest(expected, _unb64(mac))
        claims = orjson.loads(_unb64(body)) if valid else None
    except (binascii.Error, ValueError):
        raise TicketRejected(401, f"malformed {purpose}: bad base64 or JSON") from None
    if not valid:
        raise TicketRejected(401, f"bad {purpose} signature")
    if not isinstance(claims, dict):
        raise TicketRejected(401, f"malformed {purpose}: claims are not an object")
    return claims


def body_prompt_digest(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(SHA-256 hex, a lower bound on its tokens) of an OpenAI request body's prompt: a string,
    a list of token ids, or chat messages with string content (role and content bound).
    None when the body has none of these shapes (a ticket cannot bind it)."""
    digest = hashlib.sha256()
    messages = body.get("messages")
    prompt = body.get("prompt")
    if messages is not None:
        if not isinstance(messages, list):
            return None
        size = 0
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                return None
            role, content = message["role"].encode(), message["content"].encode()
            digest.update(b"\x1e" + role + b"\x1f" + content)
            size += len(role) + len(content)
        return digest.hexdigest(), math.ceil(size / MAX_TOKEN_BYTES)
    if isinstance(prompt, str):
        digest.update(b"\x1d" + prompt.encode())
        return digest.hexdigest(), math.ceil(len(prompt.encode()) / MAX_TOKEN_BYTES)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        # Token ids: their number is the prompt's length exactly.
        digest.update(b"\x1c" + ",".join(map(str, prompt)).encode())
        return digest.hexdigest(), len(prompt)
    return None


@dataclass(frozen=True)
class Ticket:
    decision_id: str
    request_id: str
    tenant: str
    region: str
    pool: str
    model: str
    max_tokens: int
    # The most prompt tokens the decision allowed for.
    prompt_tokens_max: int
    prompt_sha256: str
    expires_at: float  # epoch seconds
    mode: Mode = "proxy"
    workload_class: str = "interactive"
    # Direct mode: what the region needs to price the receipt (None: the signal was stale).
    carbon_g_per_kwh: float | None = None
    carbon_zone: str = ""
    carbon_observed_at: float | None = None
    carbon_source: str = ""

    @property
    def use_key(self) -> str:
        """The single-use key: one use per (decision, region, pool), so failover still works."""
        return f"ticket:{self.decision_id}:{self.region}:{self.pool}"

    def sign(self, keys: RegionKeys) -> str:
        if keys.region != self.region:
            raise TicketKeysError(f"a ticket for {self.region} cannot be signed with {keys.region}'s keys")
        # vars(), not asdict(): the fields are flat, and asdict's deep copy is half the cost.
        return sign(keys, "ticket", dict(vars(self)))

    @classmethod
    def verify(cls, keys: RegionKeys, token: str) -> Ticket:
        claims = verify(keys, "ticket", token)
        try:
            return cls(**claims)
        except TypeError:
            raise TicketRejected(401, "malformed ticket: unexpected claims") from None


def check(ticket: Ticket, *, region: str, now: float, body: Mapping[str, Any], pool: str | None) -> None:
    """The checks a region makes of a signed ticket against the OpenAI request body it came
    with (and the pool the request names, if any); ``TicketRejected`` with the failed check
    (401 expired, 403 otherwise)."""
    if now > ticket.expires_at:
        raise TicketRejected(401, f"ticket expired {now - ticket.expires_at:.1f} s ago")
    if ticket.expires_at - now > MAX_TICKET_TTL_S + 5.0:
        raise TicketRejected(401, f"ticket expires in {ticket.expires_at - now:.0f} s, more than {MAX_TICKET_TTL_S:.0f} s")
    if ticket.region != region:
        raise TicketRejected(403, f"ticket is for region {ticket.region}, not {region}")
    if pool is not None and pool != ticket.pool:
        raise TicketRejected(403, f"ticket is for pool {ticket.pool}, the request asks for {pool}")
    model = body.get("model")
    if model != ticket.model:
        raise TicketRejected(403, f"ticket is for model {ticket.model}, the request asks for {model!r}")
    # Every field that bounds the output: max_tokens is required, the chat alias may not exceed it.
    for name, required in (("max_tokens", True), ("max_completion_tokens", False)):
        value = body.get(name)
        if value is None and not required:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value > ticket.max_tokens:
            raise TicketRejected(403, f"{name} {value!r} exceeds the ticket's {ticket.max_tokens}")
    # Fields that multiply the work of one request: a ticket covers one completion.
    for name in ("n", "best_of"):
        if body.get(name, 1) != 1:
            raise TicketRejected(403, f"{name}={body[name]!r}: a ticket covers one completion")
    prompt = body_prompt_digest(body)
    if prompt is None:
        raise TicketRejected(403, "the request's prompt is not a string, token ids or messages with string content")
    digest, min_tokens = prompt
    if digest != ticket.prompt_sha256:
        raise TicketRejected(403, "the prompt is not the one the ticket was issued for")
    if min_tokens > ticket.prompt_tokens_max:
        raise TicketRejected(403, f"a prompt of at least {min_tokens:,} tokens exceeds the ticket's bound of "
                                  f"{ticket.prompt_tokens_max:,} tokens")
