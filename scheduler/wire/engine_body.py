"""The engine body a region receives, as the router signs it into a dispatch ticket and a
direct-mode client sends it: one shape on both sides, or the region refuses the ticket."""

from __future__ import annotations

from typing import Any


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
