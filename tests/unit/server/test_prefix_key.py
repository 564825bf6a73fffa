"""The router's prefix key: derived from the first K tokens of the system prompt (chat) or the
prompt when the client names none; the workflow id is carried; both are the tenant's own
(docs/affinity.md)."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidRequest
from scheduler.server import convert
from scheduler.server.prefix import derive_prefix_key, shared_text
from scheduler.v1 import messages_pb2 as pb
from tests.literals import region

SYSTEM = "You are a careful planner of batch jobs on a low-carbon grid. " * 40  # ~2.5 kB


def chat(system: str, user: str, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(model="llama-3.1-8b", sampling=pb.SamplingParams(max_tokens=8), chat=pb.ChatMessages(
        messages=[pb.ChatMessage(role="system", content=system), pb.ChatMessage(role="user", content=user)]),
        **fields)  # type: ignore[arg-type]


def test_the_system_prompt_decides_the_key_not_the_question(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a")])
    one = convert.incoming(chat(SYSTEM, "When should I run job 1?"), "t", snapshot).request
    two = convert.incoming(chat(SYSTEM, "And job 2?"), "t", snapshot).request
    other = convert.incoming(chat("Another assistant. " + SYSTEM, "And job 2?"), "t", snapshot).request
    assert one.prefix_key == two.prefix_key and one.prefix_key is not None and one.prefix_key.startswith("auto:")
    assert other.prefix_key != one.prefix_key
    named = convert.incoming(chat(SYSTEM, "x", prefix_key="mine", workflow_id="agent-3"), "t", snapshot).request
    assert (named.prefix_key, named.workflow_id) == ("t/mine", "t/agent-3")
    assert one.workflow_id is None


def test_keys_and_workflows_are_the_tenants_own(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    """The same system prompt, key or workflow id from two tenants never meet: their engines'
    caches are salted apart, so neither's warm prefix may be credited to (or probed by) the other."""
    snapshot = make_snapshot([region("a")])
    mine = convert.incoming(chat(SYSTEM, "q", prefix_key="k", workflow_id="w"), "acme", snapshot).request
    theirs = convert.incoming(chat(SYSTEM, "q", prefix_key="k", workflow_id="w"), "globex", snapshot).request
    assert mine.prefix_key != theirs.prefix_key and mine.workflow_id != theirs.workflow_id
    auto_mine = convert.incoming(chat(SYSTEM, "q"), "acme", snapshot).request
    auto_theirs = convert.incoming(chat(SYSTEM, "q"), "globex", snapshot).request
    assert auto_mine.prefix_key != auto_theirs.prefix_key


def test_only_the_first_k_tokens_count(make_snapshot, default_policy) -> None:  # type: ignore[no-untyped-def]
    k = 32  # 128 bytes at 4 bytes a token
    head = "x" * 128
    assert derive_prefix_key(head + "tail one", k, 4) == derive_prefix_key(head + "tail two", k, 4)
    assert derive_prefix_key(head[:-1] + "y", k, 4) != derive_prefix_key(head, k, 4)
    short = make_snapshot([region("a")], policy=default_policy.model_copy(update={"prefix_key_tokens": 16}))
    a = pb.GenerateRequest(model="llama-3.1-8b", prompt="y" * 64 + " one", sampling=pb.SamplingParams(max_tokens=4))
    b = pb.GenerateRequest(model="llama-3.1-8b", prompt="y" * 64 + " two", sampling=pb.SamplingParams(max_tokens=4))
    assert convert.incoming(a, "t", short).request.prefix_key == convert.incoming(b, "t", short).request.prefix_key


def test_shared_text_without_a_system_message_is_the_conversation() -> None:
    assert shared_text({"messages": [{"role": "user", "content": "hi"}]}) == "hi"
    assert shared_text({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == "s"
    assert shared_text({"prompt": "p"}) == "p"


def test_a_long_workflow_id_is_refused(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest, match="workflow_id"):
        convert.incoming(chat(SYSTEM, "x", workflow_id="w" * 200), "t", make_snapshot([region("a")]))


def test_the_workflow_shape_and_shared_prefix_are_carried_and_checked(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a")])
    request = convert.incoming(chat(SYSTEM, "x", workflow_id="fan-2", workflow_shape=pb.WORKFLOW_SHAPE_FANOUT,
                                    shared_prefix_tokens=600), "t", snapshot).request
    assert (request.workflow_shape, request.shared_prefix_tokens, request.holdable) == ("fanout", 600, True)
    step = convert.incoming(chat(SYSTEM, "x", workflow_id="c", workflow_shape=pb.WORKFLOW_SHAPE_CHAIN), "t",
                            snapshot).request
    assert (step.workflow_shape, step.shared_prefix_tokens, step.holdable) == ("chain", None, False)
    with pytest.raises(InvalidRequest, match="workflow_shape: needs a workflow_id"):
        convert.incoming(chat(SYSTEM, "x", workflow_shape=pb.WORKFLOW_SHAPE_DAG), "t", snapshot)
    with pytest.raises(InvalidRequest, match="workflow_shape: unknown value 9"):
        convert.incoming(chat(SYSTEM, "x", workflow_id="w", workflow_shape=9), "t", snapshot)
    with pytest.raises(InvalidRequest, match="shared_prefix_tokens: 100000 exceeds"):
        convert.incoming(chat(SYSTEM, "x", workflow_id="w", shared_prefix_tokens=100_000), "t", snapshot)
