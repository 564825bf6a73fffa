"""``scheduler init DIR``: a starter config an operator edits, copied from the examples shipped
in the package (``DIR/regions``, ``DIR/policies`` and a README saying what to do next).

It only ever creates: an existing ``regions/`` or ``policies/`` in DIR is an operator's config
and is never overwritten."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from scheduler import __version__, exit_codes
from scheduler.config.loader import SHIPPED_CONFIG

README = """\
# Scheduler config

Written by `scheduler init` (carbon-scheduler {version}) from the example fleet shipped with the
package. `regions/` holds one YAML file per region, `policies/` one per routing policy; edit them,
then check them (from this folder the two options may be left out):

    scheduler config validate --regions {folder}/regions --policies {folder}/policies

`scheduler config schema` prints every field and plugin.
"""


def register(sub: Any) -> None:
    init = sub.add_parser("init", help="write a starter config (regions/, policies/) to edit into DIR")
    init.add_argument("dir", type=Path, metavar="DIR", help="folder to write into (made if missing)")
    init.set_defaults(handler=_init)


def write_starter(folder: Path) -> list[Path]:
    """Copy the shipped regions and policies into ``folder`` and write its README; return what
    was written. Raises FileExistsError, writing nothing, when any of the three is there."""
    targets = [folder / kind for kind in SHIPPED_CONFIG] + [folder / "README.md"]
    present = [str(path) for path in targets if path.exists()]
    if present:
        raise FileExistsError(f"{', '.join(present)} already there: `scheduler init` only writes new files")
    folder.mkdir(parents=True, exist_ok=True)
    for kind, shipped in SHIPPED_CONFIG.items():
        (folder / kind).mkdir()
        for source in sorted(shipped.glob("*.yaml")):
            shutil.copyfile(source, folder / kind / source.name)
    (folder / "README.md").write_text(README.format(version=__version__, folder=folder))
    return targets


def _init(args: argparse.Namespace) -> int:
    try:
        write_starter(args.dir)
    except OSError as exc:  # FileExistsError, or a folder that cannot be made
        print(f"scheduler init: {exc}", file=sys.stderr)
        return exit_codes.FAILURE
    regions = len(list((args.dir / "regions").glob("*.yaml")))
    policies = len(list((args.dir / "policies").glob("*.yaml")))
    print(f"wrote {regions} regions, {policies} policies and a README into {args.dir}; check them with:\n"
          f"  scheduler config validate --regions {args.dir}/regions --policies {args.dir}/policies")
    return exit_codes.OK
