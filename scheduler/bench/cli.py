"""``scheduler bench router`` and ``scheduler bench load``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from scheduler.bench.load import PATHS


def register_bench(bench_sub: Any) -> None:
    bench = bench_sub.add_parser(
        "router", help="our router (proxy and direct mode) beside the backend and vllm-router",
        description="Streams the same completion directly to the backends, through a second router "
                    "(vllm-router, from the `bench` extra, or --against URL) and through our router in proxy "
                    "and direct mode, in alternating rounds; prints TTFT p50/p99, the TTFT added over direct, "
                    "each router's CPU per stream (/proc), streams/s and errors. See docs/benchmarks/router.md.")
    bench.add_argument("--requests", type=int, default=800,
                       help="measured streams per path per concurrency (default 800)")
    bench.add_argument("--concurrency", default="1,32", help="streams in flight, comma-separated (default 1,32)")
    bench.add_argument("--rounds", type=int, default=4, help="alternating rounds the streams are split into (default 4)")
    bench.add_argument("--warmup", type=int, default=50, help="unmeasured streams per path per concurrency (default 50)")
    bench.add_argument("--max-tokens", type=int, default=16)
    bench.add_argument("--first-token-delay-ms", type=float, default=0.0, help="the stub backends' prefill time")
    bench.add_argument("--backends", metavar="URL,URL",
                       help="OpenAI-compatible servers to use instead of starting two stub backends "
                            "(they must serve llama-3.1-8b)")
    bench.add_argument("--against", metavar="URL",
                       help="a running second router (OpenAI /v1/completions) instead of starting vllm-router")
    bench.add_argument("--against-pid", type=int, metavar="PID", help="its process id, to read its CPU from /proc")
    bench.add_argument("--against-name", default="against", help="its name in the table (default: against)")
    bench.add_argument("--no-vllm-router", action="store_true", help="leave vllm-router out even when installed")
    bench.add_argument("--vllm-router-policy", default="round_robin",
                       help="vllm-router's --policy (default round_robin, its cheapest)")
    bench.add_argument("--idle-s", type=float, default=3.0,
                       help="seconds to measure each router's idle CPU before the run (0: skip)")
    bench.add_argument("--json", type=Path, metavar="FILE", help="also write every figure as JSON")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(handler=_bench_router)

    load = bench_sub.add_parser(
        "load", help="many concurrent streams through one router process: errors, TTFT, CPU and memory per stream",
        description="Starts two slow stub backends and our router, opens --streams streams at once through it "
                    "(the SDK's proxy mode over gRPC or over the HTTP front door, or the OpenAI front door) and "
                    "holds them to their end; prints completed/errors, TTFT p50/p99, the router's CPU and its RSS "
                    "per open stream.")
    load.add_argument("--streams", type=int, default=1000, help="concurrent streams (default 1000)")
    load.add_argument("--seconds", type=float, default=60.0, help="how long each stream lasts (default 60)")
    load.add_argument("--max-tokens", type=int, default=60, help="tokens per stream, spread over --seconds")
    load.add_argument("--ramp-s", type=float, default=10.0, help="seconds over which the streams are opened")
    load.add_argument("--path", choices=PATHS, default="grpc",
                      help="the SDK over gRPC (grpc) or over the HTTP front door (http), or the OpenAI front door")
    load.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    load.set_defaults(handler=_bench_load)


def _bench_router(args: argparse.Namespace) -> int:
    from scheduler.bench.router import run_router_bench, settings_from_args

    try:
        settings = settings_from_args(args)
    except argparse.ArgumentTypeError as exc:
        print(exc, file=sys.stderr)
        return 2
    if settings.requests < 1 or settings.rounds < 1 or settings.warmup < 0:
        print("--requests and --rounds must be positive, --warmup not negative", file=sys.stderr)
        return 2
    if args.against_pid is not None and not args.against:
        print("--against-pid goes with --against", file=sys.stderr)
        return 2
    invoked = Path(sys.argv[0]).name == "scheduler" or sys.argv[0].endswith("scheduler/cli.py")
    command = "scheduler " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if invoked else None
    return run_router_bench(settings, command=command)


def _bench_load(args: argparse.Namespace) -> int:
    from scheduler.bench.load import LoadSettings, run_load_bench

    if args.streams < 1 or args.seconds <= 0 or args.max_tokens < 1 or args.ramp_s < 0:
        print("--streams, --seconds and --max-tokens must be positive, --ramp-s not negative", file=sys.stderr)
        return 2
    return run_load_bench(LoadSettings(streams=args.streams, seconds=args.seconds, max_tokens=args.max_tokens,
                                       ramp_s=args.ramp_s, path=args.path, json_path=args.json))
