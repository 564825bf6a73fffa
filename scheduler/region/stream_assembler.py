"""Re-assembling the engine's OpenAI event stream for the region's clients.

The engine (vLLM through Ray Serve LLM) yields ready SSE strings, ``data: {json}\\n\\n``,
ending with ``data: [DONE]\\n\\n``; with ``stream_options.include_usage`` the last JSON chunk
has ``"choices": []`` and the usage. ``StreamAssembler``:

- forwards content chunks with ``model`` rewritten to the name the client asked for (the
  local replica serves the tiny model standing for it);
- holds the usage chunk back, so that the gateway can add the ``energy`` object (computed
  once the request is over) before ``[DONE]``;
- tells ``on_progress`` the token counts each content chunk carries (the gateway asks the
  engine for vLLM's continuous usage: prompt tokens and completion tokens so far, on every
  chunk), keeps them for a stream cut before its end (``usage_so_far``) and takes them off
  the chunk (``"usage": null``, as without it) unless the client asked for them itself
  (``keep_progress``);
- notes when the first content chunk passed (time to first token).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def from_openai(cls, usage: Mapping[str, Any]) -> Usage:
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )


def sse_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _payload(event: str) -> str | None:
    """The data of one SSE event (the engine sends one ``data:`` line per event)."""
    for line in event.splitlines():
        if line.startswith("data:"):
            return line[5:].strip()
    return None


def _has_text(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return isinstance(text, str) and text != ""


@dataclass
class StreamAssembler:
    requested_model: str
    clock: Callable[[], float]
    # Told (prompt tokens, completion tokens so far) at every content chunk that carries them.
    on_progress: Callable[[int, int], None] | None = None
    # The client asked for continuous usage itself: forward it.
    keep_progress: bool = False
    usage: Usage | None = field(default=None, init=False)
    first_token_at: float | None = field(default=None, init=False)
    error: Mapping[str, Any] | None = field(default=None, init=False)
    # Chunks that carried text (about one token each), and the engine's latest running usage.
    content_events: int = field(default=0, init=False)
    _running: Usage | None = field(default=None, init=False)
    _usage_chunk: dict[str, Any] | None = field(default=None, init=False)

    def feed(self, event: str) -> bytes | None:
        """The bytes to forward for one engine event, or None when it is held back."""
        data = _payload(event)
        if data is None or data == "[DONE]":
            return None
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"engine sent a non-object SSE chunk: {data[:80]!r}")
        if "error" in chunk:
            self.error = chunk["error"]
            return sse_event(chunk)
        if "model" in chunk:
            chunk["model"] = self.requested_model
        choices = chunk.get("choices")
        if not choices and chunk.get("usage"):
            self.usage = Usage.from_openai(chunk["usage"])
            self._usage_chunk = chunk
            return None
        progress = chunk.get("usage")
        if isinstance(progress, dict):
            self._running = Usage.from_openai(progress)
            if not self.keep_progress:
                chunk["usage"] = None  # as the engine sends it without continuous usage
            if self.on_progress is not None:
                self.on_progress(int(progress.get("prompt_tokens") or 0), int(progress.get("completion_tokens") or 0))
        if choices:
            if self.first_token_at is None:
                self.first_token_at = self.clock()
            if _has_text(choices[0]):
                self.content_events += 1
        return sse_event(chunk)

    def usage_so_far(self) -> Usage | None:
        """The engine's counts of a stream cut before its end: its final usage if it came, else
        its running usage, with at least the content chunks seen as completion tokens (an engine
        that reports usage only now and then); None when it reported none."""
        if self.usage is not None:
            return self.usage
        if self._running is None:
            return None
        return Usage(self._running.prompt_tokens, max(self._running.completion_tokens, self.content_events),
                     self._running.cached_tokens)

    def finish(self, energy: Mapping[str, Any] | None, receipt: Mapping[str, Any] | None = None) -> bytes:
        """The held usage chunk (with ``energy`` and the region's ``receipt`` added when
        given), then ``[DONE]``."""
        if self._usage_chunk is None:
            return DONE
        chunk = dict(self._usage_chunk)
        if energy is not None:
            chunk["energy"] = dict(energy)
        if receipt is not None:
            chunk["receipt"] = dict(receipt)
        return sse_event(chunk) + DONE
