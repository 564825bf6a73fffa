"""``StreamAssembler``: the gateway's rewriting of the engine's SSE stream."""

from __future__ import annotations

import json

import pytest

from scheduler.region.stream_assembler import DONE, StreamAssembler, Usage

# As vLLM 0.32 through Ray Serve LLM streams them (one event per string).
CONTENT = [
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":" grid","logprobs":null,"finish_reason":null}],"usage":null}\n\n',
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":" carbon","logprobs":null,"finish_reason":"length"}],"usage":null}\n\n',
]
USAGE = (
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama","choices":[],'
    '"usage":{"prompt_tokens":200,"total_tokens":216,"completion_tokens":16,'
    '"prompt_tokens_details":{"cached_tokens":128}}}\n\n'
)
ENGINE_DONE = "data: [DONE]\n\n"


class Ticks:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def events(raw: bytes) -> list[str]:
    return [block.removeprefix("data: ") for block in raw.decode().split("\n\n") if block]


def test_content_is_forwarded_with_the_requested_model_name() -> None:
    assembler = StreamAssembler(requested_model="llama-3.1-8b", clock=Ticks())
    out = [assembler.feed(e) for e in CONTENT]
    assert all(o is not None for o in out)
    chunks = [json.loads(events(o)[0]) for o in out if o is not None]
    assert [c["model"] for c in chunks] == ["llama-3.1-8b", "llama-3.1-8b"]
    assert [c["choices"][0]["text"] for c in chunks] == [" grid", " carbon"]
    assert assembler.first_token_at == 1.0


def test_usage_is_held_back_and_finished_with_energy_then_done() -> None:
    assembler = StreamAssembler(requested_model="llama-3.1-8b", clock=Ticks())
    for event in CONTENT:
        assembler.feed(event)
    assert assembler.feed(USAGE) is None
    assert assembler.feed(ENGINE_DONE) is None
    assert assembler.usage == Usage(prompt_tokens=200, completion_tokens=16, cached_tokens=128)
    tail = assembler.finish({"energy_j": 12.5, "measurement_source": "model"})
    final, done = events(tail)
    assert done == "[DONE]"
    chunk = json.loads(final)
    assert chunk["choices"] == []
    assert chunk["model"] == "llama-3.1-8b"
    assert chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 128
    assert chunk["energy"] == {"energy_j": 12.5, "measurement_source": "model"}
    assert tail.endswith(DONE)


def test_no_usage_chunk_finishes_with_done_only() -> None:
    assembler = StreamAssembler(requested_model="m", clock=Ticks())
    assembler.feed(CONTENT[0])
    assert assembler.finish({"energy_j": 1.0}) == DONE
    assert assembler.usage is None


def test_mid_stream_error_is_forwarded_and_recorded() -> None:
    assembler = StreamAssembler(requested_model="m", clock=Ticks())
    out = assembler.feed('data: {"error":{"message":"engine died","type":"InternalServerError","code":500}}\n\n')
    assert out is not None and json.loads(events(out)[0])["error"]["code"] == 500
    assert assembler.error is not None and assembler.error["message"] == "engine died"
    assert assembler.first_token_at is None


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 4}, Usage(3, 4, 0)),
        ({"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": None}, Usage(3, 4, 0)),
        ({"prompt_tokens": 300, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 256}},
         Usage(300, 1, 256)),
    ],
    ids=["no details", "null details", "cached"],
)
def test_usage_from_openai(usage: dict[str, object], expected: Usage) -> None:
    assert Usage.from_openai(usage) == expected


def test_non_object_chunk_is_an_error() -> None:
    with pytest.raises(ValueError, match="non-object"):
        StreamAssembler(requested_model="m", clock=Ticks()).feed("data: [1, 2]\n\n")


# vLLM's continuous usage (stream_options.continuous_usage_stats), which the gateway asks for.
PROGRESS = [
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":" grid","finish_reason":null}],'
    '"usage":{"prompt_tokens":200,"total_tokens":201,"completion_tokens":1}}\n\n',
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":" carbon","finish_reason":"length"}],'
    '"usage":{"prompt_tokens":200,"total_tokens":203,"completion_tokens":3}}\n\n',
]


def test_token_counts_on_content_chunks_go_to_the_accounts_not_to_a_client_that_did_not_ask() -> None:
    seen: list[tuple[int, int]] = []
    assembler = StreamAssembler(requested_model="llama-3.1-8b", clock=Ticks(),
                                on_progress=lambda prompt, done: seen.append((prompt, done)))
    chunks = [json.loads(events(o)[0]) for o in (assembler.feed(e) for e in PROGRESS) if o is not None]
    assert seen == [(200, 1), (200, 3)]
    assert all(chunk["usage"] is None for chunk in chunks)
    assert [c["choices"][0]["text"] for c in chunks] == [" grid", " carbon"]
    assert assembler.feed(USAGE) is None and assembler.usage == Usage(200, 16, 128)


def test_a_client_that_asked_for_continuous_usage_keeps_it() -> None:
    seen: list[tuple[int, int]] = []
    assembler = StreamAssembler(requested_model="llama-3.1-8b", clock=Ticks(), keep_progress=True,
                                on_progress=lambda prompt, done: seen.append((prompt, done)))
    out = assembler.feed(PROGRESS[0])
    assert out is not None and json.loads(events(out)[0])["usage"]["completion_tokens"] == 1
    assert seen == [(200, 1)]


def _with_running_usage(event: str, completion_tokens: int) -> str:
    chunk = json.loads(event.removeprefix("data: "))
    chunk["usage"] = {"prompt_tokens": 200, "completion_tokens": completion_tokens, "total_tokens": 200}
    return "data: " + json.dumps(chunk) + "\n\n"


def test_the_running_usage_is_kept_for_a_cut_stream_and_taken_off_the_chunks() -> None:
    """With continuous usage stats every chunk says the engine's counts so far: a stream cut
    after two chunks is billed those, and the client sees the chunks as without them."""
    assembler = StreamAssembler(requested_model="m", clock=Ticks())
    assert assembler.usage_so_far() is None
    out = [assembler.feed(_with_running_usage(event, n + 1)) for n, event in enumerate(CONTENT)]
    assert [json.loads(events(o)[0])["usage"] for o in out if o is not None] == [None, None]
    assert assembler.content_events == 2 and assembler.usage is None
    assert assembler.usage_so_far() == Usage(prompt_tokens=200, completion_tokens=2, cached_tokens=0)
    # An engine whose usage lags the chunks: at least the chunks that carried text.
    lagging = StreamAssembler(requested_model="m", clock=Ticks())
    lagging.feed(_with_running_usage(CONTENT[0], 1))
    lagging.feed(CONTENT[1])
    assert lagging.usage_so_far() == Usage(prompt_tokens=200, completion_tokens=2, cached_tokens=0)
    # The final usage, once it came, is the count.
    assembler.feed(USAGE)
    assert assembler.usage_so_far() == Usage(prompt_tokens=200, completion_tokens=16, cached_tokens=128)
