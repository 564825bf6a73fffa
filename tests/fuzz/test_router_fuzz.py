"""Fuzzing the live router: Hypothesis-drawn requests to every client and admin method.

Properties, for every case: the answer is OK or a deliberate status (INVALID_ARGUMENT,
RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNAUTHENTICATED, ...), never INTERNAL, UNKNOWN or a
hang (DEADLINE_EXCEEDED); its error details stay under 16 KB; an OK answer parses; a
Generate stream read to its end closes with the energy receipt. Over the module the router
process's RSS grows by less than 100 MB (checked by the ``live_router`` fixture).

Cases: ``FUZZ_EXAMPLES`` in all (1,000 by default; ``make fuzz``: 10,000), derandomized and
without an example database, so a run is reproducible.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.v1 import admin_pb2, messages_pb2, router_pb2

from . import strategies as fz
from .conftest import (
    GENERATE,
    GET_CANARY_STATUS,
    GET_STATUS,
    LIST_REGIONS,
    MAX_STREAM_MESSAGES,
    ROUTE,
    SET_CANARY_ARM,
    SET_ENERGY_ROUTING,
    LiveRouter,
    Outcome,
    examples,
    trim_heap,
)

pytestmark = pytest.mark.integration

MAX_DETAILS_BYTES = 16 * 1024
TRIM_EVERY_CASES = 25
# A status that means the router failed rather than refused: a bug wherever it shows up.
FAILURES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED})
PARSERS = {ROUTE: router_pb2.RouteResponse, GENERATE: messages_pb2.GenerateResponse,
           LIST_REGIONS: router_pb2.ListRegionsResponse, SET_ENERGY_ROUTING: admin_pb2.SetEnergyRoutingResponse,
           GET_STATUS: admin_pb2.GetStatusResponse, GET_CANARY_STATUS: admin_pb2.GetCanaryStatusResponse,
           SET_CANARY_ARM: admin_pb2.SetCanaryArmResponse}
# Mostly a valid key (so the request reaches the parser and the converter), sometimes none,
# the other role's, or a header value that is no key.
CREDENTIALS = ("tenant",) * 6 + ("admin",) * 2 + ("",)
credentials = st.tuples(st.integers(0, len(CREDENTIALS)),
                        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)).map(
    lambda pick: CREDENTIALS[pick[0]] if pick[0] < len(CREDENTIALS) else pick[1])
# The admin methods: mostly the admin key.
ADMIN_CREDENTIALS = ("admin",) * 6 + ("tenant",) * 2 + ("",)
admin_credentials = st.tuples(st.integers(0, len(ADMIN_CREDENTIALS)), st.just("Bearer sk-nokey.nosecret")).map(
    lambda pick: ADMIN_CREDENTIALS[pick[0]] if pick[0] < len(ADMIN_CREDENTIALS) else pick[1])
read_limits = st.sampled_from([1, 3, MAX_STREAM_MESSAGES, MAX_STREAM_MESSAGES])


def fuzz_settings(share: float) -> settings:
    return settings(max_examples=examples(share), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example], print_blob=False)


def check(live: LiveRouter, outcome: Outcome, request: bytes) -> None:
    live.tally.add(outcome)
    for stub in live.stubs:
        stub.log.bodies.clear()  # the stub regions' memory, not the router's
    if live.tally.cases % TRIM_EVERY_CASES == 0:
        trim_heap()
    what = f"{outcome.method} with {len(request):,} request bytes ({request[:60]!r}...)"
    assert outcome.code not in FAILURES, f"{what}: {outcome.code.name}: {outcome.details[:500]}"
    assert outcome.details_bytes < MAX_DETAILS_BYTES, f"{what}: {outcome.details_bytes:,} bytes of error details"
    for response in outcome.responses:
        PARSERS[outcome.method].FromString(response)
    if outcome.method == GENERATE and outcome.code == grpc.StatusCode.OK and not outcome.cancelled_by_client:
        assert outcome.responses, f"{what}: an OK stream without a message"
        last = messages_pb2.GenerateResponse.FromString(outcome.responses[-1])
        assert last.WhichOneof("event") == "receipt", f"{what}: an OK stream that did not end with the receipt"


def route(live: LiveRouter, request: bytes, credential: str) -> None:
    check(live, live.run(live.unary(ROUTE, request, credential)), request)


def generate(live: LiveRouter, request: bytes, credential: str, read_at_most: int) -> None:
    check(live, live.run(live.stream(GENERATE, request, credential, read_at_most)), request)


@pytest.mark.timeout(1800)
def test_route_answers_every_generate_request_properly(live_router: LiveRouter) -> None:
    @fuzz_settings(0.3)
    @given(fz.generate_requests(), credentials)
    def case(request: messages_pb2.GenerateRequest, credential: str) -> None:
        route(live_router, request.SerializeToString(), credential)

    case()


@pytest.mark.timeout(1800)
def test_generate_streams_or_refuses_every_request(live_router: LiveRouter) -> None:
    @fuzz_settings(0.25)
    @given(fz.generate_requests(), credentials, read_limits)
    def case(request: messages_pb2.GenerateRequest, credential: str, read_at_most: int) -> None:
        generate(live_router, request.SerializeToString(), credential, read_at_most)

    case()


@pytest.mark.timeout(1800)
def test_malformed_bytes_get_invalid_argument_not_a_crash(live_router: LiveRouter) -> None:
    @fuzz_settings(0.25)
    @given(fz.generate_request_bytes, st.sampled_from([ROUTE, GENERATE]), credentials, read_limits)
    def case(request: bytes, method: str, credential: str, read_at_most: int) -> None:
        if method == ROUTE:
            route(live_router, request, credential)
        else:
            generate(live_router, request, credential, read_at_most)

    case()


@pytest.mark.timeout(1800)
def test_list_regions_and_admin_methods_refuse_properly(live_router: LiveRouter) -> None:
    requests = st.one_of(
        st.tuples(st.sampled_from([LIST_REGIONS, GET_STATUS, SET_ENERGY_ROUTING, GET_CANARY_STATUS, SET_CANARY_ARM]),
                  fz.small_request_bytes),
        st.tuples(st.just(SET_ENERGY_ROUTING), fz.set_energy_routing),
        st.tuples(st.just(SET_CANARY_ARM), fz.set_canary_arm),
    )

    @fuzz_settings(0.2)
    @given(requests, admin_credentials)
    def case(method_and_request: tuple[str, bytes], credential: str) -> None:
        method, request = method_and_request
        check(live_router, live_router.run(live_router.unary(method, request, credential)), request)

    case()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("method", "credential"), [(LIST_REGIONS, "tenant"), (GET_STATUS, "admin"),
                                                    (SET_ENERGY_ROUTING, "admin"), (GET_CANARY_STATUS, "admin"),
                                                    (SET_CANARY_ARM, "admin")])
def test_undecodable_bytes_to_the_small_methods_get_invalid_argument(live_router: LiveRouter, method: str,
                                                                     credential: str) -> None:
    """Found by this fuzzer: gRPC answered these UNKNOWN (the parser's DecodeError) before the
    edge saw the call; scheduler.server.wire.decoded now refuses them like a bad GenerateRequest."""
    undecodable = [b"\x00", b"\x0a\xff\xff\xff\xff\x0f"]  # field 0; a length past the end
    if method in (SET_ENERGY_ROUTING, SET_CANARY_ARM):
        undecodable.append(fz.field_bytes(2, b"stop\xff"))  # the reason, not UTF-8
    for request in undecodable:
        outcome = live_router.run(live_router.unary(method, request, credential))
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (request, outcome.code, outcome.details)
        assert f"not a valid request to {method}" in outcome.details
    # Still authenticated first: no key, no parsing verdict.
    outcome = live_router.run(live_router.unary(method, b"\x00", ""))
    assert outcome.code == grpc.StatusCode.UNAUTHENTICATED
