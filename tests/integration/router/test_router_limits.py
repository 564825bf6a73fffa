"""Hostile requests against a live router: every field is capped, the answer stays small, the
router does not balloon, and a declared prompt size the text cannot have is refused."""

from __future__ import annotations

import grpc
import psutil
import pytest

from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration

MAX_DETAILS_BYTES = 16 * 1024


def _request(**fields: object) -> pb.GenerateRequest:
    request = pb.GenerateRequest(model="llama-3.1-8b", prompt="Hello", sampling=pb.SamplingParams(max_tokens=8))
    for name, value in fields.items():
        if name == "jurisdictions":
            request.compliance.allowed_jurisdictions.extend(value)  # type: ignore[call-overload]
        else:
            setattr(request, name, value)
    return request


async def _refusal(target: str, request: pb.GenerateRequest | bytes) -> grpc.aio.AioRpcError:
    """Send ``request`` (or its bytes, already serialized: then the client allocates nothing
    while the router handles it) to ``Route``; the error it answers."""
    raw = request if isinstance(request, bytes) else request.SerializeToString()
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", 64 * 2**20),
                                                          ("grpc.max_receive_message_length", 64 * 2**20)]) as channel:
        route = channel.unary_unary("/scheduler.v1.GlobalRouter/Route")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await route(raw, timeout=30)
    return refused.value


def _details_bytes(error: grpc.aio.AioRpcError) -> int:
    trailing = error.trailing_metadata() or ()
    return len(error.details() or "") + sum(len(value) for _, value in trailing if isinstance(value, bytes))


@pytest.mark.timeout(60)
async def test_a_hostile_4mb_request_gets_a_small_invalid_argument(make_router: RouterFactory,
                                                                   stub_fleet: Fleet) -> None:
    router = await make_router(stub_fleet.configs)
    target = f"127.0.0.1:{router.port}"
    # 3.9 MB: 975,000 jurisdictions, each a valid-looking code; a 3 MB model name; a 3 MB
    # request id. Serialized before measuring: this process is also the router's.
    hostile = [_request(jurisdictions=["EU"] * 975_000).SerializeToString(),
               _request(model="m" * 3_000_000).SerializeToString(),
               _request(request_id="r" * 3_000_000).SerializeToString()]
    process = psutil.Process()
    before = process.memory_info().rss
    huge_list, long_model, long_id = [await _refusal(target, raw) for raw in hostile]
    grown = process.memory_info().rss - before
    for error in (huge_list, long_model, long_id):
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert _details_bytes(error) < MAX_DETAILS_BYTES
    # Refused on the wire, before the parser builds 975,000 strings.
    assert "compliance: at most 4,096 bytes, got 3,900,000" in huge_list.details()
    assert "model: at most 128 bytes, got 3,000,000" in long_model.details()
    assert "request_id: at most 128 bytes, got 3,000,000" in long_id.details()
    assert grown < 50 * 2**20, f"the router's process grew by {grown / 2**20:.0f} MB"


@pytest.mark.timeout(60)
async def test_more_than_the_message_limit_is_refused_by_grpc(make_router: RouterFactory, stub_fleet: Fleet) -> None:
    router = await make_router(stub_fleet.configs)
    error = await _refusal(f"127.0.0.1:{router.port}", _request(prompt="x" * (9 * 2**20)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.timeout(60)
async def test_a_declared_prompt_size_the_text_cannot_have_is_refused(make_router: RouterFactory,
                                                                      stub_fleet: Fleet) -> None:
    router = await make_router(stub_fleet.configs)
    target = f"127.0.0.1:{router.port}"
    error = await _refusal(target, _request(prompt="x" * 600_000, prompt_tokens=1))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_tokens: 1 is fewer than a 600,000-byte prompt can hold (at least 4,688)" in error.details()
    many = await _refusal(target, _request(jurisdictions=[f"x{i}" for i in range(20)]))
    assert "compliance.allowed_jurisdictions[0]: expected an upper-case code like 'EU', got 'x0' (and 19 more)" \
        in many.details()
    too_many = await _refusal(target, _request(jurisdictions=["EU"] * 200))  # small enough to parse
    assert "compliance.allowed_jurisdictions: at most 32 entries, got 200" in too_many.details()


@pytest.mark.timeout(60)
async def test_undecodable_bytes_get_invalid_argument_not_unknown(make_router: RouterFactory,
                                                                  stub_fleet: Fleet) -> None:
    router = await make_router(stub_fleet.configs)
    target = f"127.0.0.1:{router.port}"
    good = _request(model="llama-3.1-8b").SerializeToString()
    # Field 3 (model) with invalid UTF-8; a truncated message; a length past the end.
    bad_utf8 = good.replace(b"llama-3.1-8b", b"llama-3.1-\xff\xfe")
    for raw in (bad_utf8, good[:-3], b"\x1a\xff\xff\xff\x0f"):
        error = await _refusal(target, raw)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (raw[:20], error.details())
        assert "not a valid scheduler.v1.GenerateRequest" in error.details()


@pytest.mark.timeout(60)
async def test_a_hostile_defer_is_refused_on_the_wire_like_a_generate(make_router: RouterFactory,
                                                                       stub_fleet: Fleet) -> None:
    router = await make_router(stub_fleet.configs)
    inner = _request(jurisdictions=["EU"] * 975_000, request_id="d-1", workload_class=pb.WORKLOAD_CLASS_DEFERRABLE)
    raw = router_pb2.DeferRequest(request=inner).SerializeToString()
    process = psutil.Process()
    before = process.memory_info().rss
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}",
                                         options=[("grpc.max_send_message_length", 64 * 2**20)]) as channel:
        defer = channel.unary_unary("/scheduler.v1.GlobalRouter/Defer")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await defer(raw, timeout=30)
    grown = process.memory_info().rss - before
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "request.compliance: at most 4,096 bytes, got 3,900,000" in (refused.value.details() or "")
    assert _details_bytes(refused.value) < MAX_DETAILS_BYTES
    assert grown < 50 * 2**20, f"the router's process grew by {grown / 2**20:.0f} MB"
