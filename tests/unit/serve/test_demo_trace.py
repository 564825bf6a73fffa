"""The demo's trace slice and its report (pure parts of ``scheduler.serve.demo``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from scheduler.serve.demo import DemoOptions, Outcome, build_requests, percentile, report
from scheduler.serve.tiny_model import ensure_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    from tokenizers import Tokenizer

    model = ensure_tiny_model(tmp_path_factory.mktemp("cache"))
    return Tokenizer.from_file(str(model / "tokenizer.json"))


def test_slice_follows_the_trace_scaled_and_clipped(tokenizer: object) -> None:
    options = DemoOptions(requests=60, max_prompt_tokens=400, max_output_tokens=20)
    requests = build_requests(options, tokenizer)
    assert len(requests) == 60
    assert requests[0].offset_s == 0.0
    assert all(a.offset_s <= b.offset_s for a, b in itertools.pairwise(requests))
    lengths = [len(tokenizer.encode(r.prompt).ids) for r in requests]  # type: ignore[attr-defined]
    assert max(lengths) <= 400 * 1.1 and min(lengths) >= 12
    assert all(4 <= r.max_tokens <= 20 for r in requests)
    assert {r.jurisdiction for r in requests} <= {"", "EU", "US", "JP"}
    assert sum(1 for r in requests if r.jurisdiction) > 0


def test_requests_of_one_conversation_share_a_long_prefix(tokenizer: object) -> None:
    requests = build_requests(DemoOptions(requests=80, conversations=2), tokenizer)
    first, second = sorted((r for r in requests if r.conversation == 0), key=lambda r: -len(r.prompt))[:2]
    common = next((i for i, (a, b) in enumerate(zip(first.prompt, second.prompt, strict=False)) if a != b),
                  min(len(first.prompt), len(second.prompt)))
    assert common > 500


def test_same_seed_same_slice(tokenizer: object) -> None:
    assert build_requests(DemoOptions(requests=10), tokenizer) == build_requests(DemoOptions(requests=10), tokenizer)


def test_report_sums_per_region_and_pool() -> None:
    outcomes = [
        Outcome(region="eu-north", pool="h200-long", ttft_s=0.05, energy_j=10.0, carbon_g=0.5, prompt_tokens=300,
                reused_tokens=128, measurement_source="model"),
        Outcome(region="eu-north", pool="h200-long", mode="direct", ttft_s=0.07, energy_j=20.0, carbon_g=1.0,
                prompt_tokens=300, reused_tokens=0, fallbacks=("carbon_stale",), measurement_source="model"),
        Outcome(region="eu-north", pool="a100-batch", ttft_s=0.05, energy_j=4.0, carbon_g=0.2, prompt_tokens=50,
                measurement_source="model"),
        Outcome(region="us-east", pool="h200-long", ttft_s=0.09, energy_j=5.0, carbon_g=None, prompt_tokens=100,
                measurement_source="model"),
        Outcome(mode="direct", error="UNAVAILABLE"),
    ]
    text = report(outcomes, 12.0, None)
    assert "5 requests replayed in 12.0 s: 4 answered, 1 failed" in text
    assert "by mode: direct 2 (1 failed), proxy 3 (0 failed)" in text
    eu = next(line for line in text.splitlines() if line.startswith("eu-north/h200-long"))
    assert eu.split() == ["eu-north/h200-long", "2", "600", "128", "30.0", "1.500", "15.0"]
    batch = next(line for line in text.splitlines() if line.startswith("eu-north/a100-batch"))
    assert batch.split()[:2] == ["eu-north/a100-batch", "1"]
    us = next(line for line in text.splitlines() if line.startswith("us-east/h200-long"))
    assert "n/a" in us
    assert "carbon_stale x1" in text
    assert "128 of 750 prompt tokens (17.1 %)" in text


def test_percentile() -> None:
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile(list(range(101)), 99) == 99
    assert percentile([], 50) != percentile([], 50)  # nan


def test_trace_file_is_shipped() -> None:
    assert Path(DemoOptions().trace).exists()
