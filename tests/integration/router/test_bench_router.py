"""``scheduler bench router``, run tiny: real processes (two stub backends, our router with
ticket keys, vllm-router when installed), a few streams per path at concurrency 1 and 2.
Checks the shape of the JSON and that every path streamed without errors; no figure is
compared against a time (the machine is shared)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from scheduler.bench import router as bench
from scheduler.cli import main

pytestmark = pytest.mark.integration

STREAMS = 4
TINY = ["bench", "router", "--requests", str(STREAMS), "--rounds", "2", "--warmup", "1", "--concurrency", "1,2",
        "--idle-s", "0", "--no-progress"]
ROUTERS = (bench.VLLM_ROUTER, bench.OURS_PROXY, bench.OURS_GRPC, bench.OURS_OPENAI, bench.OURS_DIRECT)


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    assert main([*TINY, "--json", str(out), *extra]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _check_paths(report: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert [run["concurrency"] for run in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert tuple(run["paths"]) == expected
        for name, figures in run["paths"].items():
            where = f"c={run['concurrency']} {name}"
            assert figures["errors"] == 0, (where, figures["error_samples"])
            assert figures["streams"] == STREAMS, where
            assert figures["ttft_ms"]["p50"] > 0 and figures["ttft_ms"]["p99"] >= figures["ttft_ms"]["p50"], where
            assert figures["streams_per_s"] > 0 and figures["wall_s"] > 0, where
            assert figures["client_cpu_ms_per_stream"] >= 0, where
            if name == bench.DIRECT:
                assert figures["added_ttft_ms"] is None and figures["router_cpu_ms_per_stream"] is None
            else:
                assert figures["added_ttft_ms"] is not None, where
                # /proc counts in 10 ms ticks: a few streams may read as 0, never as missing.
                assert figures["router_cpu_ms_per_stream"] >= 0, where
        # Our router answers proxy-mode streams with its receipt, over HTTP and gRPC.
        assert run["paths"][bench.OURS_PROXY]["receipts"] == STREAMS
        assert run["paths"][bench.OURS_GRPC]["receipts"] == STREAMS


def test_every_path_with_vllm_router(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.vllm_router_installed(), f"vllm-router {bench.NOT_INSTALLED} (the dev extra installs it)"
    report = _run(tmp_path)
    _check_paths(report, (bench.DIRECT, *ROUTERS))
    assert report["settings"]["ticket_keys"] is True
    assert report["skipped"] == {}
    goals = report["goals"]
    for name in ("direct_mode_router_cpu", "direct_mode_added_ttft", "proxy_router_cpu", "openai_router_cpu",
                 "grpc_router_cpu", "proxy_added_ttft", "openai_added_ttft", "grpc_added_ttft"):
        assert isinstance(goals[name]["pass"], bool), name
    assert set(goals["direct_mode_added_ttft"]["ms"]) == {bench.OURS_DIRECT, bench.VLLM_ROUTER}
    assert goals["proxy_throughput"]["pass"] is None  # no run at concurrency 32 here
    printed = capsys.readouterr().out
    assert "concurrency 1" in printed and "concurrency 2" in printed
    assert "our router's CPU per request in ours-direct" in printed


def test_without_vllm_router_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "vllm_router_installed", lambda: False)
    report = _run(tmp_path)
    _check_paths(report, (bench.DIRECT, bench.OURS_PROXY, bench.OURS_GRPC, bench.OURS_OPENAI, bench.OURS_DIRECT))
    assert report["skipped"] == {bench.VLLM_ROUTER: bench.NOT_INSTALLED}
    assert report["goals"]["direct_mode_added_ttft"]["pass"] is None
    printed = capsys.readouterr().out
    assert "not installed: pip install '.[bench]'" in printed
    assert "SKIP  TTFT added by ours-direct" in printed


# --- the pure parts ---------------------------------------------------------------------------


def test_cpu_seconds_reads_proc() -> None:
    before = bench.cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert bench.cpu_seconds(os.getpid()) >= before >= 0


def test_percentile_and_split() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 0.5) == 50.0
    assert bench.percentile(values, 0.99) == 99.0
    assert bench.percentile([3.0], 0.99) == 3.0
    assert bench.split(10, 4) == [3, 3, 2, 2]
    assert sum(bench.split(7, 7)) == 7


def _run_figures(c: int, cpu: float, ours_added: float, theirs_added: float | None,
                 proxy_cpu: float = 0.8, proxy_rate: float = 80.0, their_rate: float = 100.0) -> dict[str, Any]:
    paths: dict[str, Any] = {
        bench.DIRECT: {"added_ttft_ms": None, "router_cpu_ms_per_stream": None, "streams_per_s": 120.0},
        bench.OURS_PROXY: {"added_ttft_ms": {"p50": 0.9, "p99": 2.0}, "router_cpu_ms_per_stream": proxy_cpu,
                           "streams_per_s": proxy_rate},
        bench.OURS_DIRECT: {"added_ttft_ms": {"p50": ours_added, "p99": ours_added}, "router_cpu_ms_per_stream": cpu,
                            "streams_per_s": 100.0},
    }
    if theirs_added is not None:
        paths[bench.VLLM_ROUTER] = {"added_ttft_ms": {"p50": theirs_added, "p99": theirs_added},
                                    "router_cpu_ms_per_stream": 0.1, "streams_per_s": their_rate}
    return {"concurrency": c, "paths": paths}


def test_goals() -> None:
    good = bench.goals([_run_figures(1, 0.2, 0.5, 0.6), _run_figures(32, 0.3, 2.0, 1.0)], bench.VLLM_ROUTER)
    assert good["direct_mode_router_cpu"]["pass"] is True
    assert good["direct_mode_added_ttft"]["pass"] is True  # judged at concurrency 1 only
    assert good["proxy_router_cpu"]["pass"] is True and good["proxy_added_ttft"]["pass"] is True
    assert good["proxy_throughput"]["pass"] is True and good["proxy_throughput"]["share"] == pytest.approx(0.8)
    assert good["openai_router_cpu"]["pass"] is None  # the path was not run
    bad = bench.goals([_run_figures(1, 0.2, 0.7, 0.6), _run_figures(32, 0.31, 0.1, 1.0, proxy_cpu=1.2, proxy_rate=60.0)],
                      bench.VLLM_ROUTER)
    assert bad["direct_mode_router_cpu"]["pass"] is False
    assert bad["direct_mode_added_ttft"]["pass"] is False
    assert bad["proxy_router_cpu"]["pass"] is False and bad["proxy_throughput"]["pass"] is False
    lines = bench.goal_lines(bad)
    assert lines[0].startswith("FAIL") and lines[1].startswith("FAIL")
    alone = bench.goals([_run_figures(1, 0.2, 0.7, None)], None)
    assert alone["direct_mode_added_ttft"]["pass"] is None
    assert any(line.startswith("SKIP  TTFT added by ours-direct") for line in bench.goal_lines(alone))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["grpc", "http", "openai"])
def test_the_load_bench_holds_its_streams_on_every_path(tmp_path: Path, path: str) -> None:
    out = tmp_path / "load.json"
    assert main(["bench", "load", "--streams", "20", "--seconds", "1", "--max-tokens", "4", "--ramp-s", "0",
                 "--path", path, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["path"], report["completed"], report["errors"]) == (path, 20, {})
    assert report["open_peak"] > 1 and report["ttft_ms"]["p50"] > 0
