#!/usr/bin/env python3
"""Generate scheduler/v1/ from protos/scheduler/v1/*.proto (``make protos``).

The proto package ``scheduler.v1`` is also the Python package, so the generated files import
each other as ``from scheduler.v1 import ..._pb2`` without rewriting. ``--check`` generates
into a temporary folder and exits 1 when the committed files differ (the drift test runs it).
"""

from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PACKAGE = Path("scheduler") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc for every proto of the package into ``out_dir``; return the files written."""
    protos = sorted((PROTO_DIR / PACKAGE).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR / PACKAGE}")
    command = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
        f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", f"--pyi_out={out_dir}",
        *(str(p.relative_to(PROTO_DIR)) for p in protos),
    ]
    subprocess.run(command, check=True, cwd=PROTO_DIR)
    return generated_files(out_dir)


def generated_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def drift(committed_root: Path) -> list[str]:
    """Differences between the committed generated files and a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        committed = {p.name: p for p in generated_files(committed_root)}
        problems = [f"missing: {PACKAGE / n}" for n in sorted(fresh.keys() - committed.keys())]
        problems += [f"stale extra file: {PACKAGE / n}" for n in sorted(committed.keys() - fresh.keys())]
        problems += [
            f"differs from protos/: {PACKAGE / n}"
            for n in sorted(fresh.keys() & committed.keys())
            if not filecmp.cmp(fresh[n], committed[n], shallow=False)
        ]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if scheduler/v1/ is out of date")
    args = parser.parse_args()
    if args.check:
        problems = drift(ROOT)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `make protos` and commit the result", file=sys.stderr)
        return 1 if problems else 0
    (ROOT / PACKAGE).mkdir(parents=True, exist_ok=True)
    init = ROOT / PACKAGE / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated from protos/scheduler/v1 by scripts/gen_protos.py; do not edit."""\n')
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
