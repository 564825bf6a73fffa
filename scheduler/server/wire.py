"""A guard in front of the protobuf parser for the client API's requests.

Parsing a hostile message costs far more than its size: 4 MB of repeated jurisdictions
become 1.3 million strings and ~50 MB of parser arena before any of our checks run. So the
request deserializer first walks the top-level fields of a message over ``WALK_ABOVE_BYTES``
on the wire (a handful of length prefixes, no allocation per entry) and refuses any field
longer than a real request needs, then parses. Whatever it refuses, or the parser cannot
decode (invalid UTF-8 in a string, a truncated message), becomes a ``RejectedRequest``, which
the edge answers with INVALID_ARGUMENT naming the field, instead of the parser's exception as
UNKNOWN. The other scheduler.v1 methods' requests get only the second half (``decoded``):
undecodable bytes are refused the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from scheduler.errors import FieldViolation

# GenerateRequest's top-level fields: (name, the most bytes it may take). The prompt and the
# chat messages are bounded by the gRPC message limit and the converter's prompt cap.
GENERATE_REQUEST_FIELDS: Mapping[int, tuple[str, int]] = {
    1: ("tenant", 128),
    2: ("request_id", 128),
    3: ("model", 128),
    4: ("prompt", 1 << 62),
    5: ("chat", 1 << 62),
    6: ("sampling", 8 * 1024),
    8: ("slo", 64),
    9: ("compliance", 4 * 1024),
    10: ("client_location", 64),
    11: ("prefix_key", 256),
    15: ("workflow_id", 128),
}
MAX_TOP_LEVEL_FIELDS = 64
# Up to this size a message is parsed without the walk: whatever it holds, parsing it costs
# little (a few thousand entries at most), and the converter checks every field's length and
# count as it reads them (scheduler.server.convert), with the same field paths in its errors.
# The walk costs a few microseconds per request whatever the size, so it guards larger ones.
WALK_ABOVE_BYTES = 16 * 1024
# DeferRequest: its GenerateRequest (field 1) is walked with GenerateRequest's limits.
DEFER_REQUEST_FIELDS: Mapping[int, tuple[str, int]] = {1: ("request", 1 << 62)}
DEFER_REQUEST_NESTED: Mapping[int, Mapping[int, tuple[str, int]]] = {1: GENERATE_REQUEST_FIELDS}


@dataclass(frozen=True)
class RejectedRequest:
    """What the deserializer hands the handler instead of a message it refused."""

    violations: tuple[FieldViolation, ...]


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def oversized_fields(data: bytes, limits: Mapping[int, tuple[str, int]],
                     nested: Mapping[int, Mapping[int, tuple[str, int]]] | None = None) -> list[FieldViolation]:
    """Top-level fields longer than their limit (and a message with too many fields); a field
    in ``nested`` is a message whose own fields are walked with the limits given there."""
    violations = []
    position = fields = 0
    size = len(data)
    while position < size:
        fields += 1
        if fields > MAX_TOP_LEVEL_FIELDS:
            return [FieldViolation("request", f"more than {MAX_TOP_LEVEL_FIELDS} top-level fields")]
        # A one-byte varint inline (every key and most lengths of a request): a call each costs more.
        key = data[position]
        if key < 0x80:
            position += 1
        else:
            key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, position = _varint(data, position)
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        elif wire_type == 2:
            if position < size and data[position] < 0x80:
                length = data[position]
                position += 1
            else:
                length, position = _varint(data, position)
            name, limit = limits.get(number, (f"field {number}", 1024))
            if length > limit:
                violations.append(FieldViolation(name, f"at most {limit:,} bytes, got {length:,}"))
            elif nested and number in nested:
                inner = oversized_fields(data[position:position + length], nested[number])
                violations.extend(FieldViolation(f"{name}.{v.field}", v.description) for v in inner)
            position += length
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
    if position > size:
        raise ValueError("truncated message")
    return violations


def _undecodable(what: str, exc: Exception) -> RejectedRequest:
    detail = str(exc)[:120] or type(exc).__name__
    return RejectedRequest((FieldViolation("request", f"not a valid {what}: {detail}"),))


def guarded(parse: Callable[[bytes], Any], limits: Mapping[int, tuple[str, int]], what: str,
            nested: Mapping[int, Mapping[int, tuple[str, int]]] | None = None) -> Callable[[bytes], Any]:
    """A request deserializer: the message, or a ``RejectedRequest`` saying why not."""

    def deserialize(data: bytes) -> Any:
        try:
            if len(data) > WALK_ABOVE_BYTES:
                violations = oversized_fields(data, limits, nested)
                if violations:
                    return RejectedRequest(tuple(violations))
            return parse(data)
        except (DecodeError, ValueError) as exc:
            return _undecodable(what, exc)

    return deserialize


def decoded(parse: Callable[[bytes], Any], what: str) -> Callable[[bytes], Any]:
    """A request deserializer for the small messages (ListRegions, the admin methods): no size
    walk, but bytes the parser cannot decode become a ``RejectedRequest`` too, not UNKNOWN."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return _undecodable(what, exc)

    return deserialize
