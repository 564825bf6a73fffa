#!/usr/bin/env python3
"""Instructions the router executes per request over its HTTP front door: a measure of the
router's work per request that does not move with the host's speed or with whatever else runs
on its cores (wall and CPU times do, by half on the 2-core test host), for comparing two trees.

    python scripts/route_instructions.py [--path route|openai] [--requests 200] [--tree DIR]

Needs valgrind (Debian: ``apt-get install valgrind``). The router (the bench's two-region fleet,
shipped policy, ticket keys, memory state, carbon from the shipped CSVs) runs in-process under
callgrind with counting off; a client process (not counted) sends requests over one kept-alive
connection: ``route``, the SDK's direct-mode ``Route`` as the SDK sends it; ``openai``, a
16-token streamed ``/v1/completions`` that the router proxies to a stub region (another process,
not counted). Counting is on only while they run; two runs (``N`` and ``2N`` requests) differ by
the work of ``N`` requests, which cancels start-up and the counting toggles. ``--tree`` measures
another checkout (e.g. ``git worktree add /tmp/base main~3``) with this interpreter. The hash
seed is fixed (``PYTHONHASHSEED=0``); what varies still (request ids, the refresher's timing)
moves repeated runs of one tree by up to ~0.5 %: compare differences larger than that.

Valgrind runs code without the CPU's SHA extensions and its counts know no caches: a ticket's
HMAC weighs more here than on the host, and a count is work, not time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGIONS = ("eu-north", "eu-central")
PROMPT = "Summarise the energy cost of serving one language-model request in a sentence."

# The client: requests over one keep-alive connection, each answer read whole (a content-length
# body, or a chunked stream to its last chunk).
CLIENT = r"""
import socket, sys
port, count, path, content_type, body = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                         bytes.fromhex(sys.argv[5]))
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
request = (b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: carbon-scheduler-sdk\r\n"
           b"content-type: %s\r\nconnect-protocol-version: 1\r\ncontent-length: %d\r\n\r\n"
           % (path.encode(), content_type.encode(), len(body))) + body
reader = sock.makefile("rb")
for _ in range(count):
    sock.sendall(request)
    status, length, chunked = reader.readline(), 0, False
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"transfer-encoding":
            chunked = b"chunked" in value
    if b" 200 " not in status:
        sys.exit(f"{path} answered {status!r}")
    if not chunked:
        reader.read(length)
        continue
    while (size := int(reader.readline().strip(), 16)) > 0:
        reader.read(size + 2)
    reader.readline()
"""


def _callgrind(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


async def _serve_and_count(path: str, requests: int) -> None:
    """Inside valgrind: start the router's HTTP front door (and for ``openai`` a stub region),
    warm it, count ``requests`` requests."""
    from scheduler.client.common import build_request
    from scheduler.datalayer.snapshot import SnapshotBuilder
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.server.app import build_deps, with_services
    from scheduler.server.http_api import build_http_server
    from scheduler.state.memory_store import MemoryStore
    from scheduler.tickets import TicketKeyRing

    stub = None
    endpoint = "http://127.0.0.1:9"  # Route sends nothing to the regions
    if path == "openai":
        stub = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scheduler.server.stub_region", "--port", "0", stdout=asyncio.subprocess.PIPE)
        assert stub.stdout is not None
        endpoint = "http://127.0.0.1:" + (await stub.stdout.readline()).decode().split()[-1]
    fleet = load_checked_fleet()
    regions = tuple(r.model_copy(update={"endpoint": endpoint}) for r in fleet.regions if r.name in REGIONS)
    policy = fleet.policy("default")
    # The bench's policy: a region that publishes no state is trusted (as `bench router` does).
    policy = policy.model_copy(update={"unknown_region_state": policy.unknown_region_state.model_copy(
        update={"missing": "assume-healthy"})})
    deps = build_deps(SnapshotBuilder(regions, policy), MemoryStore(), "memory",
                      ticket_keys=TicketKeyRing.generate(REGIONS))
    with_services(deps, carbon_pollers=True)
    for task in deps.lifecycle():
        await task.start()
    await asyncio.sleep(3.0)  # the carbon pollers' first signals
    await deps.refresher.refresh()
    server = build_http_server(deps)
    port = await server.start("127.0.0.1", 0)
    if path == "route":
        target, content_type = "/scheduler.v1.GlobalRouter/Route", "application/proto"
        body = build_request(prompt=PROMPT, model="llama-3.1-8b", max_tokens=16,
                             decision_detail="summary").SerializeToString()
    else:
        target, content_type = "/v1/completions", "application/json"
        body = json.dumps({"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": 16, "stream": True}).encode()

    async def client(count: int) -> None:
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, str(port), str(count), target,
                                                       content_type, body.hex())
        if await process.wait() != 0:
            raise SystemExit("the client failed")

    await client(100)  # warm: caches, memo tables, connections
    _callgrind(True)
    await client(requests)
    _callgrind(False)
    await server.stop(grace_s=0.1)
    if stub is not None:
        stub.terminate()
        await stub.wait()


def _count(tree: Path, path: str, requests: int, out_dir: Path) -> int:
    out = out_dir / f"callgrind.{requests}.out"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
               sys.executable, str(Path(__file__).resolve()), "--path", path, "--inside", str(requests)]
    result = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
                            capture_output=True, text=True, check=False)
    match = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or match is None:
        raise SystemExit(f"valgrind run failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=("route", "openai"), default="route",
                        help="route: the SDK's direct-mode Route; openai: a streamed /v1/completions, proxied")
    parser.add_argument("--requests", type=int, default=200, help="N: the runs count N and 2N requests")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--inside", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        import uvloop

        uvloop.run(_serve_and_count(args.path, args.inside))
        os._exit(0)  # the background tasks need no orderly stop here
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.requests <= 0:
        print(f"--requests: expected a positive number, got {args.requests}", file=sys.stderr)
        return 2
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory() as scratch:
        once = _count(tree, args.path, args.requests, Path(scratch))
        twice = _count(tree, args.path, 2 * args.requests, Path(scratch))
    what = "Route" if args.path == "route" else "proxied 16-token /v1/completions stream"
    print(f"{tree}: {(twice - once) / args.requests:,.0f} instructions per {what} over HTTP "
          f"({args.requests} and {2 * args.requests} requests: {once:,} and {twice:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
