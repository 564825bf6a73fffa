"""The prefix key of a request: which requests share a cacheable prompt prefix.

A client may name one (``GenerateRequest.prefix_key``, ``x_scheduler.prefix_key``). Without
one, the router derives it from the text every request of a conversation or an agent's
steps begins with: the system prompt of a chat (its leading ``system``/``developer``
messages), or the prompt of a completion. The key hashes the first K tokens of that text
(``policy.prefix_key_tokens``; tokens approximated as the router estimates them everywhere,
``BYTES_PER_TOKEN`` bytes of UTF-8 each, since the router has no tokenizer):

    prefix_key = "auto:" + sha256(tenant + NUL + first K x BYTES_PER_TOKEN bytes of the text)[:24 hex]

Two requests of one tenant get the same key exactly when those bytes agree, which is when an
engine's prefix cache (vLLM hashes blocks of 16 tokens from the start) can serve the one's KV
to the other. A system prompt shorter than K is hashed whole. No prompt text leaves this
function.

Keys are per tenant, as the engines' caches are: the regions salt each tenant's prefix cache
(vLLM's ``cache_salt``, scheduler.region.gateway), so one tenant's KV never serves another's
request and a tenant cannot probe another's cached prefixes through ``cached_tokens``. A key a
client names is scoped the same way (``scoped``), and so is a workflow id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

AUTO_PREFIX = "auto:"
SYSTEM_ROLES = frozenset({"system", "developer"})


def shared_text(body: Mapping[str, Any]) -> str:
    """The text a request's prefix key is derived from: a chat's leading system/developer
    messages (all messages when there is none: the conversation so far), or the prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages: Sequence[Mapping[str, Any]] = body.get("messages") or ()
    leading: list[str] = []
    for message in messages:
        if message.get("role") not in SYSTEM_ROLES:
            break
        leading.append(str(message.get("content", "")))
    chosen = leading or [str(m.get("content", "")) for m in messages]
    return "\n".join(chosen)


def derive_prefix_key(text: str, k_tokens: int, bytes_per_token: int, tenant: str = "") -> str:
    """The key of the first ``k_tokens`` tokens of ``text`` for ``tenant`` (module doc)."""
    # A character is at least one byte: the first n characters hold the first n bytes, so a
    # long prompt is not encoded whole for its head.
    n = k_tokens * bytes_per_token
    head = text[:n].encode()[:n]
    return AUTO_PREFIX + hashlib.sha256(tenant.encode() + b"\0" + head).hexdigest()[:24]


def scoped(tenant: str, name: str) -> str:
    """A client-named prefix key or workflow id within its tenant: ``<tenant>/<name>``."""
    return f"{tenant}/{name}"
