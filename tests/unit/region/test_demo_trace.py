"""The demo's trace slice and its report (pure parts of ``scheduler.region.demo``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from scheduler.region.demo import DemoOptions, Outcome, build_requests, percentile, report
from scheduler.region.tiny_model import ensure_tiny_model


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


def test_report_ends_with_the_power_cap_dry_run_per_region_and_pool() -> None:
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.region.power_caps import PowerCapper, apply_region_caps
    from tests.unit.region.fake_nvml import FakeNvml

    regions = {r.name: r for r in load_checked_fleet().regions}
    eu = regions["eu-north"].model_copy(update={"eco": True})
    reports = [apply_region_caps(region, [p.pool for p in region.local.pools],  # type: ignore[union-attr]
                                 capper=PowerCapper(FakeNvml(library_found=False)))[0]
               for region in (regions["us-east"], eu)]
    text = report([Outcome(region="us-east", pool="h200-long", energy_j=1.0, measurement_source="model")], 1.0,
                  None, reports)
    section = text[text.index("power caps, as each region's serving side set them at start"):]
    assert section.count("dry run: no GPU") == 3  # us-east/h200-long, eu-north/h200-long, eu-north/a100-batch
    assert "power cap us-east/h200-long (H200-141GB, TDP 700 W): configured 700 W, eco cap 365 W (eco off), " \
           "target 700 W" in section
    assert "would leave GPU 0 (H200-141GB): 700 W (assumed: the default limit, TDP) -> 700 W" in section
    assert "power cap eu-north/a100-batch (A100-80GB, TDP 400 W): configured 400 W, eco cap 205 W (eco on), " \
           "target 205 W" in section
    assert "would set GPU 1 (A100-80GB): 400 W (assumed: the default limit, TDP) -> 205 W, not clamped" in section
    assert "nothing was set" in section and " set GPU" not in section.replace("would set GPU", "")


def test_power_caps_are_fetched_from_each_region_or_dry_run_locally() -> None:
    import asyncio

    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.region.demo import fetch_power_caps
    from scheduler.region.power_caps import dry_run_report

    regions = [r for r in load_checked_fleet().regions if r.name in ("us-east", "eu-north")]
    answered = dry_run_report(regions[0], ["h200-long"], reason="NVML: NVMLError_LibraryNotFound")

    class Answer:
        def raise_for_status(self) -> None: ...

        def json(self) -> object:
            return answered.as_dict()

    class Http:
        async def get(self, url: str, timeout: float) -> Answer:
            if url.endswith(f"/{answered.region}/power-caps"):
                return Answer()
            raise ConnectionError(url)

    by_region = {r.region: r for r in asyncio.run(
        fetch_power_caps(regions, lambda name: f"http://127.0.0.1:8000/{name}", Http()))}
    assert by_region[answered.region] == answered
    other = next(name for name in by_region if name != answered.region)
    assert by_region[other].mode == "dry-run" and "did not answer (ConnectionError)" in by_region[other].reason
