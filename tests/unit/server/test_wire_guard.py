"""The wire guard (scheduler.server.wire) in front of the GenerateRequest parser: a large message
with an oversized field is refused before it is parsed, naming the field; a small one is parsed
(cheap whatever it holds) and the converter refuses the same field by the same path."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidRequest
from scheduler.server.convert import incoming
from scheduler.server.edge import GUARDED_DESERIALIZERS
from scheduler.server.wire import WALK_ABOVE_BYTES, RejectedRequest
from scheduler.testing import region, snapshot
from scheduler.v1 import messages_pb2 as pb

pytestmark = pytest.mark.timeout(30)

deserialize = GUARDED_DESERIALIZERS["/scheduler.v1.GlobalRouter/Route"]


def _request(**fields: object) -> bytes:
    message = pb.GenerateRequest(model="llama-3.1-8b", prompt="hello", sampling=pb.SamplingParams(max_tokens=8))
    for name, value in fields.items():
        setattr(message, name, value)
    return message.SerializeToString()


def test_a_large_message_with_an_oversized_field_is_refused_before_parsing() -> None:
    data = _request(tenant="t" * 300, prompt="p" * (WALK_ABOVE_BYTES + 1))
    refused = deserialize(data)
    assert isinstance(refused, RejectedRequest)
    assert [(v.field, v.description) for v in refused.violations] == [("tenant", "at most 128 bytes, got 300")]


def test_a_small_message_is_parsed_and_the_converter_refuses_the_same_field() -> None:
    data = _request(tenant="t" * 300)
    assert len(data) <= WALK_ABOVE_BYTES
    parsed = deserialize(data)
    assert isinstance(parsed, pb.GenerateRequest)
    with pytest.raises(InvalidRequest) as refused:
        incoming(parsed, "t" * 300, snapshot(region("us-east")))
    assert [v.field for v in refused.value.violations] == ["tenant"]


def test_undecodable_bytes_are_refused_at_any_size() -> None:
    for data in (b"\x0a\x05ab", b"\x1a\x03\xff\xfe\xfd"):  # a truncated string; invalid UTF-8
        refused = deserialize(data)
        assert isinstance(refused, RejectedRequest) and refused.violations[0].field == "request"
