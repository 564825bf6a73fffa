"""Dispatch tickets: the router's decision, signed, so that a region runs only what was decided.

A ticket binds one dispatch: decision id, request id, tenant, region, pool, model, the
endpoint (``/v1/completions`` or ``/v1/chat/completions``), ``max_tokens``, a bound on the
prompt's tokens, a SHA-256 digest of the body the engine will run (``body_digest``: every
field of ``ENGINE_FIELDS`` but those checked on their own, in canonical JSON), the dispatch
mode (proxy: the router streams and writes the receipt; direct: the client streams and the
region writes the receipt) and an expiry at most ``MAX_TICKET_TTL_S`` ahead. A region
rebuilds the engine's body from ``ENGINE_FIELDS`` (``engine_body``): any other field, a
message key outside ``MESSAGE_KEYS``, or a body with both ``prompt`` and ``messages`` is
refused, so what runs is exactly what the router decided on. It is signed with
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

# The fields of an OpenAI request body a region passes to its engine; any other is refused.
# The one list: the router's OpenAI front door passes exactly these (those its request message
# does not carry itself) and refuses the rest (scheduler.server.openai_front). Beside OpenAI's
# own, vLLM's extensions: top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
# stop_token_ids, include_stop_str_in_output, skip_special_tokens, chat_template_kwargs.
ENGINE_FIELDS = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options",
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logprobs", "top_logprobs", "logit_bias", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "user", "min_tokens", "ignore_eos", "echo", "reasoning_effort", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "chat_template_kwargs",
})
# Checked on their own (the ticket's model and max_tokens, one completion, the stream the
# region sets up), so not in the digest: a router and a client may write them differently.
DIGEST_EXCLUDED = frozenset({"model", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options"})
# Sampling fields that are real numbers: 0 and 0.0 are the same temperature, so the digest
# writes them one way whatever JSON the client sent.
REAL_FIELDS = frozenset({"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                         "repetition_penalty"})
_DIGESTED = ENGINE_FIELDS - DIGEST_EXCLUDED
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
COMPLETIONS, CHAT_COMPLETIONS = "/v1/completions", "/v1/chat/completions"

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


def engine_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's request from a client's body: its ``ENGINE_FIELDS``, checked to be the
    shape a ticket binds; ``TicketRejected(403)`` naming what is not allowed."""
    unknown = sorted(set(body) - ENGINE_FIELDS)
    if unknown:
        raise TicketRejected(403, f"field(s) {', '.join(map(repr, unknown))} not allowed (allowed: "
                                  f"{', '.join(sorted(ENGINE_FIELDS))})")
    if "prompt" in body and "messages" in body:
        raise TicketRejected(403, "a request has a prompt or messages, not both")
    messages = body.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise TicketRejected(403, "messages must be a list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise TicketRejected(403, f"messages[{i}] must be an object")
            extra = sorted(set(message) - MESSAGE_KEYS)
            if extra:
                raise TicketRejected(403, f"messages[{i}]: key(s) {', '.join(map(repr, extra))} not allowed "
                                          f"(allowed: {', '.join(sorted(MESSAGE_KEYS))})")
    return dict(body)


def message_body(role: str, content: str, name: str = "", tool_call_id: str = "",
                 tool_calls: list[Any] | None = None) -> dict[str, Any]:
    """One chat message of an engine body, as the router signs it and a direct-mode client
    sends it: OpenAI's optional keys only when set, and no content (null) for an assistant
    message that only calls tools."""
    out: dict[str, Any] = {"role": role, "content": content}
    if name:
        out["name"] = name
    if tool_call_id:
        out["tool_call_id"] = tool_call_id
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
        if not content:
            out["content"] = None
    return out


def _canonical(name: str, value: Any) -> Any:
    if name in REAL_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _prompt_bytes(body: Mapping[str, Any]) -> int | None:
    """UTF-8 bytes of the prompt's text (messages: roles and string contents), or -(token
    count) for a prompt of token ids; None when there is no prompt of a known shape."""
    messages = body.get("messages")
    prompt = body.get("prompt")
    if messages is not None:
        if not isinstance(messages, list):
            return None
        size = 0
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return None
            content = message.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            size += len(message["role"].encode()) + len(text.encode())
        return size
    if isinstance(prompt, str):
        return len(prompt.encode())
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return -len(prompt)
    return None


def body_digest(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(SHA-256 hex of the body's content in canonical JSON, a lower bound on its prompt's
    tokens): its ``ENGINE_FIELDS`` but ``DIGEST_EXCLUDED`` (a region refuses any other field
    before it looks at the digest), keys sorted, real sampling values as floats.
    None when the body has no prompt or messages of a known shape (a ticket cannot bind it)."""
    size = _prompt_bytes(body)
    if size is None:
        return None
    content = {name: _canonical(name, value) for name, value in body.items() if name in _DIGESTED}
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    # Token ids: their number is the prompt's length exactly; text: at least one token per
    # MAX_TOKEN_BYTES bytes, a bound that needs no tokenizer.
    return digest, -size if size < 0 else math.ceil(size / MAX_TOKEN_BYTES)


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
    # ``body_digest`` of the body the engine will run, and the endpoint it goes to.
    body_sha256: str
    expires_at: float  # epoch seconds
    endpoint: str = COMPLETIONS
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


# How far a region's clock may be from the router's before it refuses a ticket as expired or
# as expiring too far ahead (the default of the gateway's ``ticket_clock_skew_s``).
CLOCK_SKEW_S = 5.0


def check(ticket: Ticket, *, region: str, now: float, body: Mapping[str, Any], pool: str | None,
          endpoint: str, clock_skew_s: float = CLOCK_SKEW_S) -> None:
    """The checks a region makes of a signed ticket against the OpenAI request body it came
    with (``engine_body`` of it), the endpoint it was sent to and the pool it names, if any;
    ``TicketRejected`` with the failed check (401 expired, 403 otherwise). ``clock_skew_s``: how
    far the region's clock may be behind or ahead of the router's."""
    if now > ticket.expires_at + clock_skew_s:
        raise TicketRejected(401, f"ticket expired {now - ticket.expires_at:.1f} s ago (clock-skew tolerance "
                                  f"{clock_skew_s:g} s)")
    if ticket.expires_at - now > MAX_TICKET_TTL_S + clock_skew_s:
        raise TicketRejected(401, f"ticket expires in {ticket.expires_at - now:.0f} s, more than "
                                  f"{MAX_TICKET_TTL_S:.0f} s (clock-skew tolerance {clock_skew_s:g} s)")
    if ticket.region != region:
        raise TicketRejected(403, f"ticket is for region {ticket.region}, not {region}")
    if endpoint != ticket.endpoint:
        raise TicketRejected(403, f"ticket is for {ticket.endpoint}, the request went to {endpoint}")
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
    # A ticket covers one completion.
    if body.get("n", 1) != 1:
        raise TicketRejected(403, f"n={body['n']!r}: a ticket covers one completion")
    bound = body_digest(body)
    if bound is None:
        raise TicketRejected(403, "the request's prompt is not a string, token ids or a list of messages")
    digest, min_tokens = bound
    if digest != ticket.body_sha256:
        raise TicketRejected(403, "the request is not the one the ticket was issued for (its prompt, messages "
                                  "or sampling fields differ)")
    if min_tokens > ticket.prompt_tokens_max:
        raise TicketRejected(403, f"a prompt of at least {min_tokens:,} tokens exceeds the ticket's bound of "
                                  f"{ticket.prompt_tokens_max:,} tokens")
