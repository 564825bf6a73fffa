"""The ``scheduler`` command. Each area registers its own subcommands (``register``) and
benchmarks (``register_bench``); heavy imports stay inside the handlers so that
``scheduler config validate`` starts in a fraction of a second."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from scheduler import __version__, exit_codes
from scheduler.config.args import resolve_config_dirs

# Modules exposing register(subparsers) and/or register_bench(bench_subparsers).
COMMAND_MODULES = (
    "scheduler.config.starter",
    "scheduler.plugins.cli",
    "scheduler.datalayer.cli",
    "scheduler.energy.cli",
    "scheduler.ledger.cli",
    "scheduler.decide",
    "scheduler.server.cli",
    "scheduler.client_cli.config_reload",
    "scheduler.client_cli.admin",
    "scheduler.canary.cli",
    "scheduler.region.cli",
    "scheduler.sim.cli",
    "scheduler.capacity.cli",
    "scheduler.deferral.cli",
    "scheduler.bench.cli",
    "scheduler.gate.cli",
)


def build_parser() -> argparse.ArgumentParser:
    # Named as it was called: `scheduler` or `carbon-scheduler` (the same entry point).
    prog = "carbon-scheduler" if Path(sys.argv[0]).name == "carbon-scheduler" else "scheduler"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0] if __doc__ else None,
                                     epilog="exit codes: 0 ok, 1 failure, 2 usage error, 3 unschedulable (route), "
                                            "4 config error (docs/cli.md)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "register"):
            module.register(sub)
        if hasattr(module, "register_bench"):
            module.register_bench(bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The command line as given: ``router --workers N`` starts its workers with it.
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resolve_config_dirs(args, Path.cwd(), sys.stderr)
    try:
        code: int = args.handler(args)
    except BrokenPipeError:  # `scheduler ... | head`: the reader left; not an error
        sys.stderr.close()
        return exit_codes.OK
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
