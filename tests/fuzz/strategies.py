"""Hypothesis strategies for the router's request messages: valid, boundary and hostile.

A ``GenerateRequest`` case starts from a valid request and replaces a few of its fields (or
all of them) with values drawn from each field's whole range: empty and oversized strings,
odd unicode, lists far past their caps, negative and huge numbers, NaN and infinities,
enum values the proto does not name. The ``*_bytes`` strategies go below the message: random
bytes, mutated encodings, wrong wire types and strings with invalid UTF-8 (which a Python
``str`` cannot hold, so they are built on the wire and sent through a raw channel call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import strategies as st

from scheduler.server.convert import CHAT_ROLES, MAX_CHAT_MESSAGES, MAX_PROMPT_BYTES, MAX_TOKENS_LIMIT
from scheduler.v1 import admin_pb2
from scheduler.v1 import messages_pb2 as pb

# Models the fuzz fleet serves (tests/fuzz/conftest.py), and a few it does not.
SERVED_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "llama-3.2-3b", "llama-3.2-1b")
VALID_MAX_TOKENS = (1, 2, 8, 16)
UINT32_MAX = 2**32 - 1
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# Sizes around every cap the router has (convert.py, wire.py) and past the gRPC limit (8 MiB).
HUGE_LENGTHS = (0, 1, 8, 9, 64, 65, 128, 129, 256, 257, 1024, 4097, 65_537)
# Prompts at the converter's cap in bytes (one more), in 1-, 2- and 4-byte characters, and
# past the gRPC message limit.
HUGE_PROMPTS = (("x", MAX_PROMPT_BYTES), ("x", MAX_PROMPT_BYTES + 1), ("é", MAX_PROMPT_BYTES // 2),
                ("é", MAX_PROMPT_BYTES // 2 + 1), ("🤖", MAX_PROMPT_BYTES // 4 + 1), ("x", 9 * 2**20))
LIST_LENGTHS = (0, 1, 16, 17, 32, 33, 2048, 2049, 100_000)

# Every code point UTF-8 can encode (surrogates cannot: a Python str holding one does not
# serialize; invalid UTF-8 is built on the wire below), NUL, controls, RTL marks and all.
odd_text = st.text(st.characters(codec="utf-8"), max_size=48)
tricky_text = st.sampled_from(["", " ", "\x00", "\u202e", "\ufeff", "e\u0301", "\U0010ffff", "🤖" * 3,
                               "EU", "eu", "E U", "EUROPE12", "x" * 128, "y" * 129, "\n\t"])


def repeated(piece: st.SearchStrategy[str], lengths: Sequence[int]) -> st.SearchStrategy[str]:
    """A string of ``piece`` repeated to one of ``lengths`` characters (cheap to draw when huge)."""
    return st.builds(lambda p, n: (p * (n // len(p) + 1))[:n], piece.filter(bool), st.sampled_from(lengths))


small_text = st.one_of(odd_text, tricky_text)
any_text = st.one_of(small_text, repeated(odd_text, HUGE_LENGTHS))
# What a list repeated far past its cap holds: a few bytes each, so that no case is more than
# a few MB on the wire (a long string times a long list would be gigabytes in this process).
short_text = st.one_of(tricky_text.filter(lambda t: len(t) <= 8), odd_text.map(lambda t: t[:8]))
any_float = st.floats(allow_nan=True, allow_infinity=True)
any_uint32 = st.one_of(st.integers(0, UINT32_MAX), st.sampled_from([0, 1, MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT + 1,
                                                                    UINT32_MAX]))


def text_list(values: st.SearchStrategy[str], short: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    """Short lists of ``values`` (at most one of them huge), or one ``short`` value repeated far
    past the list caps."""
    return st.one_of(st.lists(values, max_size=40),
                     st.builds(lambda v, huge: [*v, huge], st.lists(values, max_size=3), repeated(odd_text, HUGE_LENGTHS)),
                     st.builds(lambda v, n: [v] * n, short, st.sampled_from(LIST_LENGTHS)))


def _chat(messages: list[pb.ChatMessage]) -> pb.ChatMessages:
    return pb.ChatMessages(messages=messages)


chat_message = st.builds(pb.ChatMessage, role=st.one_of(st.sampled_from(sorted(CHAT_ROLES)), any_text),
                         content=any_text)
chat_messages = st.one_of(
    st.builds(_chat, st.lists(chat_message, max_size=6)),
    st.builds(lambda m, n: _chat([m] * n),
              st.builds(pb.ChatMessage, role=st.one_of(st.sampled_from(sorted(CHAT_ROLES)), short_text),
                        content=short_text),
              st.sampled_from([MAX_CHAT_MESSAGES, MAX_CHAT_MESSAGES + 1, 50_000])),
)

# One strategy per GenerateRequest field: each sets that field (or leaves it unset) on a message.
Setter = Callable[[pb.GenerateRequest], None]


def _assign(name: str) -> Callable[[object], Setter]:
    def make(value: object) -> Setter:
        def apply(msg: pb.GenerateRequest) -> None:
            setattr(msg, name, value)
        return apply
    return make


def _set_input(value: str | pb.ChatMessages | None) -> Setter:
    def apply(msg: pb.GenerateRequest) -> None:
        msg.ClearField("prompt")
        msg.ClearField("chat")
        if isinstance(value, str):
            msg.prompt = value
        elif value is not None:
            msg.chat.CopyFrom(value)
    return apply


def _message(name: str, factory: Callable[..., object]) -> Callable[..., Setter]:
    def make(**fields: object) -> Setter:
        def apply(msg: pb.GenerateRequest) -> None:
            getattr(msg, name).CopyFrom(factory(**{k: v for k, v in fields.items() if v is not None}))
        return apply
    return make


def _absent(name: str) -> st.SearchStrategy[Setter]:
    return st.just(lambda msg: msg.ClearField(name))


def optional(value: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(st.none(), value)


FIELD_STRATEGIES: dict[str, st.SearchStrategy[Setter]] = {
    "tenant": st.one_of(st.sampled_from(["", "acme", "ops", "globex"]), any_text).map(_assign("tenant")),
    "request_id": any_text.map(_assign("request_id")),
    "model": st.one_of(st.sampled_from(SERVED_MODELS), any_text).map(_assign("model")),
    "input": st.one_of(
        st.none(), any_text, st.sampled_from(HUGE_PROMPTS).map(lambda piece_n: piece_n[0] * piece_n[1]), chat_messages,
    ).map(_set_input),
    "sampling": st.one_of(_absent("sampling"), st.builds(
        _message("sampling", pb.SamplingParams),
        max_tokens=any_uint32, temperature=optional(any_float), top_p=optional(any_float),
        stop=optional(text_list(small_text, short_text)), seed=optional(st.integers(*INT64)),
    )),
    "workload_class": st.one_of(st.sampled_from(sorted(pb.WorkloadClass.values())), st.integers(*INT32))
    .map(_assign("workload_class")),
    "slo": st.one_of(_absent("slo"), st.builds(_message("slo", pb.Slo), ttft_ms=optional(any_float),
                                               tpot_ms=optional(any_float))),
    "compliance": st.one_of(_absent("compliance"), st.builds(
        _message("compliance", pb.Compliance),
        allowed_jurisdictions=optional(text_list(st.one_of(st.sampled_from(["EU", "US", "CH"]), small_text),
                                                  st.one_of(st.just("EU"), short_text))),
        required_certifications=optional(text_list(st.one_of(st.sampled_from(["SOC2", "HIPAA"]), small_text),
                                                   st.one_of(st.just("SOC2"), short_text))),
        precision=optional(st.one_of(st.sampled_from(["bf16", "fp8", "int4"]), any_text)),
        task_class=optional(st.one_of(st.just("medical"), any_text)),
    )),
    "client_location": st.one_of(_absent("client_location"),
                                 st.builds(_message("client_location", pb.GeoPoint), lat=any_float, lon=any_float)),
    "prefix_key": any_text.map(_assign("prefix_key")),
    "prompt_tokens": st.one_of(_absent("prompt_tokens"), any_uint32.map(_assign("prompt_tokens"))),
    "cached_tokens": st.one_of(_absent("cached_tokens"), any_uint32.map(_assign("cached_tokens"))),
}


def valid_request(model: str = "llama-3.1-8b", max_tokens: int = 8) -> pb.GenerateRequest:
    return pb.GenerateRequest(model=model, prompt="Hello there", sampling=pb.SamplingParams(max_tokens=max_tokens))


@st.composite
def generate_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    """A valid request with a few fields (sometimes none, sometimes all) replaced by fuzz."""
    msg = valid_request(draw(st.sampled_from(SERVED_MODELS)), draw(st.sampled_from(VALID_MAX_TOKENS)))
    if draw(st.booleans()):
        msg.chat.messages.add(role="user", content=draw(odd_text) or "hi")
    names = sorted(FIELD_STRATEGIES)
    chosen = draw(st.one_of(st.just(set()), st.sets(st.sampled_from(names), max_size=1),
                            st.sets(st.sampled_from(names), max_size=3), st.just(set(names))))
    for name in sorted(chosen):
        draw(FIELD_STRATEGIES[name])(msg)
    return msg


# --- below the message: bytes -------------------------------------------------------------

INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                b"\xe2\x82", b"\x80", b"ok\xffok")


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field on the wire."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


bad_utf8 = st.builds(lambda head, bad, tail: head + bad + tail,
                     st.binary(max_size=8), st.sampled_from(INVALID_UTF8), st.binary(max_size=8))


def _nested_bad_utf8(path: tuple[int, ...], payload: bytes) -> bytes:
    for number in reversed(path):
        payload = field_bytes(number, payload)
    return payload


# String fields of GenerateRequest, by path of field numbers (top-level and nested).
STRING_PATHS = ((1,), (2,), (3,), (4,), (11,), (5, 1, 1), (5, 1, 2), (6, 4), (9, 1), (9, 2), (9, 3), (9, 4))


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Each edit (kind, where, value): flip a byte, insert one, delete one, or truncate."""
    out = bytearray(data)
    for kind, where, value in edits:
        at = where % (len(out) + 1)
        if kind == 0 and at < len(out):
            out[at] ^= value or 1
        elif kind == 1:
            out.insert(at, value)
        elif kind == 2 and at < len(out):
            del out[at]
        elif kind == 3:
            del out[at:]
    return bytes(out)


def _serialized(msg: pb.GenerateRequest) -> bytes:
    return msg.SerializeToString()


valid_bytes = st.builds(lambda m, n: _serialized(valid_request(m, n)), st.sampled_from(SERVED_MODELS),
                        st.sampled_from(VALID_MAX_TOKENS))
edit = st.tuples(st.integers(0, 3), st.integers(0, 4096), st.integers(0, 255))
random_field = st.builds(lambda number, wire_type, body: varint(number << 3 | wire_type) + body,
                         st.one_of(st.integers(0, 20), st.integers(0, 2**29 - 1)), st.integers(0, 7),
                         st.binary(max_size=24))

generate_request_bytes = st.one_of(
    st.binary(max_size=256),
    # A valid request with one string field (top-level or nested) holding invalid UTF-8.
    st.builds(lambda base, path, bad: base + _nested_bad_utf8(path, bad), valid_bytes,
              st.sampled_from(STRING_PATHS), bad_utf8),
    # A (fuzzed) request, then flipped, inserted, deleted or truncated bytes.
    st.builds(_mutate, st.one_of(valid_bytes, generate_requests().map(_serialized).filter(lambda b: len(b) < 1 << 16)),
              st.lists(edit, min_size=1, max_size=4)),
    # Unknown fields, wrong wire types for known ones, overlong varints, huge declared lengths.
    st.builds(lambda base, extra: base + b"".join(extra), valid_bytes, st.lists(random_field, min_size=1, max_size=4)),
    st.builds(lambda base, n: base + varint(3 << 3 | 2) + varint(n), valid_bytes,
              st.sampled_from([2**31, 2**32 + 1, 2**63, 2**64 - 1])),
    st.builds(lambda base, k: base + b"\xff" * k, valid_bytes, st.integers(1, 12)),
)

# --- the small methods ------------------------------------------------------------------------

small_request_bytes = st.one_of(st.just(b""), st.binary(max_size=64), st.lists(random_field, max_size=4).map(b"".join),
                                st.builds(lambda bad: field_bytes(2, bad), bad_utf8))
set_energy_routing = st.builds(
    admin_pb2.SetEnergyRoutingRequest, enabled=st.booleans(),
    reason=st.one_of(odd_text, tricky_text, repeated(odd_text, (0, 64, 4097, 65_537))),
).map(lambda m: m.SerializeToString())
set_canary_arm = st.builds(
    admin_pb2.SetCanaryArmRequest, enabled=st.booleans(),
    reason=st.one_of(odd_text, tricky_text, repeated(odd_text, (0, 64, 4097, 65_537))),
).map(lambda m: m.SerializeToString())
