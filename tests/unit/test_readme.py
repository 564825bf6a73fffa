"""The README's promises about itself: it starts with the two commands, keeps one dated line per
figure (the runs are in docs/benchmarks-history.md), draws the architecture and says the demo model's
weights are random."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def test_it_starts_with_the_two_commands() -> None:
    title, fence, demo, test, close = [line for line in README.splitlines() if line.strip()][:5]
    assert title.startswith("# ") and fence == close == "```"
    assert demo.startswith("make demo ") and test.startswith("make test ")


def test_one_line_per_figure_and_the_runs_in_the_appendix() -> None:
    rows = [line for line in _section("Measured on").splitlines() if line.startswith("| ") and "---" not in line]
    header, *figures = rows
    assert header.startswith("| what | command | figure |") and len(figures) >= 8
    for row in figures:
        assert len(set(DATE.findall(row))) <= 1, f"more than one dated run in: {row[:80]}"
    history = (REPO / "docs" / "benchmarks-history.md").read_text()
    assert "## The README's figures, run by run" in history
    assert "(benchmarks-history.md)" in (REPO / "docs" / "benchmarks.md").read_text()


def test_the_architecture_picture_names_the_parts_and_both_modes() -> None:
    picture = _section("How it fits together")
    assert "```mermaid" in picture
    for part in ("router", "Redis", "carbon providers", "RegionGateway", "vLLM", "proxy mode", "direct mode"):
        assert part in picture, part


def test_it_says_the_demo_model_has_random_weights() -> None:
    assert "random weights" in README[:README.index("## What it does")]
