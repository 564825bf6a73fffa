"""The request sets ``gate measure`` runs: the shipped ones load, a round's streams are what the
set says, prompts are the same in every run and distinct between samples, and a bad file
names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.config.loader import ConfigError
from scheduler.gate.request_set import calls, load_request_set, synthetic_text


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["standard", "local"])
def test_shipped_sets_have_the_four_buckets(name: str) -> None:
    request_set = load_request_set(name)
    assert [b.name for b in request_set.buckets] == ["short-chat", "long-context", "long-output", "fan-out"]
    for bucket in request_set.buckets:
        # Each round fills the batch the set keeps in flight.
        assert len(calls(request_set, bucket, 0)) >= request_set.concurrency


@pytest.mark.timeout(30)
def test_a_round_sends_copies_and_fanout_branches_with_their_own_tags() -> None:
    request_set = load_request_set("standard")
    fan = calls(request_set, request_set.bucket("fan-out"), 2, pool="h200-long")
    assert len(fan) == 8
    hints = [c.body["x_scheduler"] for c in fan]
    assert len({h["workflow_id"] for h in hints}) == 1 and all(h["workflow_shape"] == "fanout" for h in hints)
    assert all(h["pool"] == "h200-long" and h["prefix_key"] == h["workflow_id"] for h in hints)
    contents = [c.body["messages"][0]["content"] for c in fan]
    # The branches share their workflow's prefix and differ in the part they answer.
    assert len(set(contents)) == 8 and len({text.split("\n\nAnswer part")[0] for text in contents}) == 1
    long_context = calls(request_set, request_set.bucket("long-context"), 0)
    prompts = [c.body["messages"][0]["content"] for c in long_context]
    assert len(set(prompts)) == 8 and all(len(p.split()) > 12_000 for p in prompts)
    # The same round is the same prompts in every run; another round's are others.
    assert prompts == [c.body["messages"][0]["content"] for c in calls(request_set, request_set.bucket("long-context"), 0)]
    assert not set(prompts) & {c.body["messages"][0]["content"]
                               for c in calls(request_set, request_set.bucket("long-context"), 1)}
    output = calls(request_set, request_set.bucket("long-output"), 0, model="qwen3-32b")
    assert {c.body["model"] for c in output} == {"qwen3-32b"} and "pool" not in output[0].body["x_scheduler"]
    assert output[0].body["x_scheduler"]["workload_class"] == "batch" and output[0].body["stream"] is True


@pytest.mark.timeout(30)
def test_synthetic_text_is_fixed_by_its_seed() -> None:
    assert synthetic_text(200, "a") == synthetic_text(200, "a") != synthetic_text(200, "b")
    assert len(synthetic_text(200, "a").split()) == 200


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("text", "fragment"), [
    ("name: x\nmodel: llama-3.1-8b\nbuckets: []\n", "buckets"),
    ("name: x\nmodel: gpt-9\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 8}]}]\n", "model: 'gpt-9'"),
    ("name: x\nmodel: llama-3.1-8b\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 0}]}]\n",
     "buckets[0].requests[0].max_tokens"),
    ("name: x\nmodel: llama-3.1-8b\nrounds: {min: 5, max: 2}\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 8}]}]\n",
     "max (2) must be at least min (5)"),
    ("name: x\nmodel: llama-3.1-8b\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 8}]},"
     " {name: a, requests: [{text: hi, max_tokens: 8}]}]\n", "repeated: ['a']"),
])
def test_a_bad_set_names_the_file_and_field(text: str, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "set.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_request_set(str(path))
    assert str(path) in str(caught.value) and fragment in str(caught.value)


@pytest.mark.timeout(30)
def test_the_digest_is_of_the_content_not_the_layout(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("name: x\nmodel: llama-3.1-8b\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 8}]}]\n")
    b.write_text("# a comment\nname: x\nmodel: llama-3.1-8b\nbuckets:\n  - name: a\n    requests:\n"
                 "      - {max_tokens: 8, text: hi}\n")
    assert load_request_set(str(a)).digest == load_request_set(str(b)).digest
    b.write_text("name: x\nmodel: llama-3.1-8b\nbuckets: [{name: a, requests: [{text: hi, max_tokens: 9}]}]\n")
    assert load_request_set(str(a)).digest != load_request_set(str(b)).digest
