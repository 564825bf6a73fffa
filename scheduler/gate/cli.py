"""``scheduler gate measure | compare``: the energy release gate (docs/gate.md).

    scheduler gate measure --against http://router:8080 --out baseline.json
    scheduler gate measure --against http://127.0.0.1:8000/eu-north --pool h200-long --out candidate.json
    scheduler gate compare baseline.json candidate.json --max-increase 5% \\
        --quality baseline_quality.json candidate_quality.json --max-quality-drop 1%

``measure`` exits 0 when every stream gave a sample, 1 when some failed (the file is written
with their errors), 2 when the request set or the arguments are unusable. ``compare`` exits 0
(passed), 1 (energy rose, or a bucket is missing), 3 (quality dropped), 4 (both), 2 (the files
cannot be compared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

API_KEY_ENV = "SCHEDULER_API_KEY"


def register(sub: Any) -> None:
    gate = sub.add_parser("gate", help="energy release gate: measure J per output token, compare two measurements")
    actions = gate.add_subparsers(dest="gate_command", required=True, metavar="ACTION")

    measure = actions.add_parser("measure", help="run a request set through a router or a region; record J/token "
                                                 "per bucket from the receipts")
    measure.add_argument("--against", required=True, metavar="URL",
                         help="the OpenAI-compatible base URL: a router's HTTP front door (http://router:8080) or a "
                              "region's gateway with tickets disabled (http://127.0.0.1:8000/eu-north, with --pool)")
    measure.add_argument("--requests", default="standard", metavar="FILE",
                         help="a request set: a YAML file, or a shipped one by name: standard (default), local")
    measure.add_argument("--out", required=True, type=Path, help="the measurement file to write (JSON)")
    measure.add_argument("--pool", help="run on this pool of the region (a region's gateway only)")
    measure.add_argument("--model", help="the model to ask for (default: the set's)")
    measure.add_argument("--api-key", help=f"the router's tenant key (default ${API_KEY_ENV})")
    measure.add_argument("--label", default="", help="what was measured, e.g. 'vllm 0.33, fp8 kv cache' (kept in the file)")
    measure.add_argument("--timeout", type=float, default=600.0, help="seconds one stream may wait for data (default 600)")
    measure.add_argument("--quiet", action="store_true", help="no progress bar")
    measure.set_defaults(handler=_measure)

    compare = actions.add_parser("compare", help="fail when the candidate's J/token rose past the threshold beyond the "
                                                 "measurement interval, or its quality dropped")
    compare.add_argument("baseline", type=Path)
    compare.add_argument("candidate", type=Path)
    compare.add_argument("--max-increase", default="5%", help="J/token rise allowed beyond the intervals (default 5%%)")
    compare.add_argument("--require-measured", action="store_true",
                         help="fail a candidate bucket whose receipts were only modelled (the telemetry gate)")
    compare.add_argument("--quality", nargs=2, type=Path, metavar=("BASELINE_QUALITY", "CANDIDATE_QUALITY"),
                         help="quality score files (docs/gate.md)")
    compare.add_argument("--max-quality-drop", default="1%", help="relative drop of a score allowed (default 1%%)")
    compare.set_defaults(handler=_compare)


class _Bar:
    """``measure``'s progress (``scheduler.gate.measure.Progress``) as a tqdm bar on stderr (off
    with --quiet or when not a terminal)."""

    def __init__(self, quiet: bool) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=0, unit="stream", file=sys.stderr, disable=True if quiet else None, dynamic_ncols=True)

    def grow(self, streams: int) -> None:
        self._bar.total = (self._bar.total or 0) + streams
        self._bar.refresh()

    def step(self, bucket: str) -> None:
        self._bar.set_description(bucket, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _measure(args: argparse.Namespace) -> int:
    from scheduler.config.loader import ConfigError
    from scheduler.gate.measure import Target, TargetError, measure
    from scheduler.gate.request_set import load_request_set

    try:
        request_set = load_request_set(args.requests)
    except ConfigError as exc:
        print(f"gate measure: {exc}", file=sys.stderr)
        return 2
    if not args.against.startswith(("http://", "https://")):
        print(f"gate measure: --against must be an http(s) URL, got {args.against!r}", file=sys.stderr)
        return 2
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    target = Target(url=args.against, api_key=api_key, pool=args.pool, timeout_s=args.timeout)
    bar = _Bar(args.quiet)
    try:
        result = asyncio.run(measure(request_set, target, model=args.model, label=args.label, progress=bar))
    except TargetError as exc:
        print(f"gate measure: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary_table(result))
    print(f"wrote {args.out}")
    if result["failed"]:
        print(f"gate measure: {result['failed']} streams gave no sample, e.g. {result['errors'][0]}", file=sys.stderr)
        return 1
    return 0


def summary_table(result: dict[str, Any]) -> str:
    """One line per bucket: n, mean J/token and its interval, the sources and pools seen."""
    lines = [f"{'bucket':<14}{'n':>5}  {'J/token':<10}{'interval':<24}{'rounds':>6}  sources  pools"]
    for name, b in result["buckets"].items():
        mean = f"{b['mean_j_per_token']:.4g}" if b["mean_j_per_token"] is not None else "-"
        interval = (f"[{b['low_j_per_token']:.4g}, {b['high_j_per_token']:.4g}]"
                    if b["low_j_per_token"] is not None else "-")
        sources = "+".join(f"{k}:{v}" for k, v in sorted(b["sources"].items())) or "-"
        pools = ",".join(sorted(b["places"])) or "-"
        stable = "" if b["stable"] else " (not stable)"
        lines.append(f"{name:<14}{b['n']:>5}  {mean:<10}{interval:<24}{b['rounds']:>6}  {sources}  {pools}{stable}")
    return "\n".join(lines)


def _compare(args: argparse.Namespace) -> int:
    from scheduler.config.loader import ConfigError
    from scheduler.gate import compare

    try:
        max_increase = compare.parse_fraction(args.max_increase)
        max_drop = compare.parse_fraction(args.max_quality_drop)
    except ValueError as exc:
        print(f"gate compare: {exc}", file=sys.stderr)
        return compare.UNUSABLE
    try:
        baseline, _ = compare.load_measurement(args.baseline)
        candidate, candidate_sha = compare.load_measurement(args.candidate)
        quality = None if args.quality is None else tuple(compare.load_quality(p) for p in args.quality)
    except ConfigError as exc:
        print(f"gate compare: {exc}", file=sys.stderr)
        return compare.UNUSABLE
    problems = compare.comparable(baseline, candidate, (args.baseline, args.candidate))
    if problems:
        for problem in problems:
            print(f"gate compare: {problem}", file=sys.stderr)
        return compare.UNUSABLE
    energy = compare.energy_rows(baseline, candidate, max_increase, args.require_measured)
    print(f"J per output token, baseline {args.baseline} vs candidate {args.candidate}, "
          f"max increase {max_increase:.1%} beyond the intervals")
    print(compare.render("bucket", energy))
    if candidate.failed:
        print(f"note: {candidate.failed} streams of the candidate gave no sample (see its errors)")
    quality_rows: list[compare.Row] = []
    if quality is not None:
        quality_rows = compare.quality_rows(quality[0], quality[1], max_drop)
        print(f"\nquality, max drop {max_drop:.1%}")
        print(compare.render("score", quality_rows))
    code = compare.exit_code(energy, quality_rows)
    verdict = {compare.PASSED: "PASSED", compare.ENERGY_FAILED: "FAILED: energy per token rose",
               compare.QUALITY_FAILED: "FAILED: quality dropped",
               compare.BOTH_FAILED: "FAILED: energy per token rose and quality dropped"}[code]
    print(f"\ngate {verdict}")
    places = compare.measured_places(candidate)
    if code == compare.PASSED and places:
        # What a policy's telemetry gate needs to open these pools (docs/gate.md).
        print("every candidate receipt was metered; to let these pools take all traffic, add to the policy's "
              "telemetry_gate.passed:")
        for place in places:
            print(f"  - {{pool: {place}, measurement_sha256: {candidate_sha}}}")
    return code
