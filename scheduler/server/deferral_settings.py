"""The router's deferral settings (``scheduler router --deferral-*``; docs/deferral.md has the
defaults and why): per-tenant caps, the Defer prompt limit, retention, and which stores may
keep which jurisdictions' deferred requests. Light on imports: the CLI reads it to build its
parser.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from scheduler import errors


def _shown(url: str) -> str:
    """A store URL as messages show it: without credentials."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url.rstrip("/")
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port is not None else ""
    return parts._replace(netloc=host + port).geturl().rstrip("/")


@dataclasses.dataclass(frozen=True)
class DeferralSettings:
    """The router's deferral settings (``scheduler router --deferral-*``; docs/deferral.md has
    the defaults and why)."""

    # Requests one tenant may hold at once (held or running).
    max_held: int = 10_000
    # Bytes one tenant's held requests and kept answers (and cancellations) may take in the
    # store, each value plus ``scheduler.deferral.queue.KEY_OVERHEAD_BYTES`` per key.
    max_bytes: int = 128 * 2**20
    # The largest prompt (or chat messages) Defer takes: a held prompt sits in the store for
    # hours, so it is smaller than a live request's (convert.MAX_PROMPT_BYTES, 4 MiB).
    max_prompt_bytes: int = 256 * 2**10
    # A held request is kept until its deadline and this much more (time for a late release to
    # be answered as failed), then it lapses.
    grace_s: float = 900.0
    # An answer (or a cancellation) is kept this long for the client to fetch.
    result_ttl_s: float = 86400.0
    # A router's claim on a release, renewed while it runs: a router that dies lets it lapse
    # within this, and another router (or the same, restarted) runs the request again.
    claim_ttl_s: float = 15.0
    # Releases one router runs at once (a window releases many requests together).
    max_running: int = 16
    # The release loop's period (it also passes as soon as a run ends).
    interval_s: float = 1.0
    # This router's store (its --state URL) and, per jurisdiction, the stores its deferred
    # requests may be kept in; a jurisdiction not named may be kept in any store.
    store_url: str = "memory"
    stores: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_held", "max_bytes", "max_prompt_bytes", "max_running"):
            if getattr(self, name) < 1:
                raise ValueError(f"deferral {name}: expected at least 1, got {getattr(self, name)}")
        for name in ("grace_s", "result_ttl_s", "claim_ttl_s", "interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"deferral {name}: expected seconds > 0, got {getattr(self, name)}")

    def refusal(self, jurisdictions: Iterable[str]) -> errors.StorageRefused | None:
        """Why this router's store may not keep a request allowed to run in ``jurisdictions``;
        None when it may. A request that may run anywhere may be kept anywhere; one allowed in
        several jurisdictions may be kept where any of them allows (it could run there)."""
        codes = tuple(sorted(jurisdictions))
        here = _shown(self.store_url)
        if not codes or any(code not in self.stores or here in {_shown(u) for u in self.stores[code]}
                            for code in codes):
            return None
        where = "; ".join(f"{code} in {', '.join(_shown(u) for u in self.stores[code])}" for code in codes)
        return errors.StorageRefused(codes, (
            f"deferred requests of jurisdiction {', '.join(codes)} may only be stored {where}; this router's "
            f"store is {here}: defer it through a router on an allowed store, or run it now with Generate"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``scheduler router``'s deferral flags (``settings_from``)."""
    d = DeferralSettings()
    parser.add_argument("--deferral-max-held", type=int, default=d.max_held, metavar="N",
                        help=f"deferred requests one tenant may hold at once (default {d.max_held:,})")
    parser.add_argument("--deferral-max-bytes", type=int, default=d.max_bytes, metavar="BYTES",
                        help=f"bytes one tenant's held requests and kept answers may take in the store "
                             f"(default {d.max_bytes:,})")
    parser.add_argument("--deferral-max-prompt-bytes", type=int, default=d.max_prompt_bytes, metavar="BYTES",
                        help=f"the largest prompt Defer takes (default {d.max_prompt_bytes:,}; smaller than a "
                             f"live request's 4 MiB: it is stored until it runs)")
    parser.add_argument("--deferral-grace", type=float, default=d.grace_s, metavar="S",
                        help=f"a held request is kept until its deadline and this much more (default {d.grace_s:g})")
    parser.add_argument("--deferral-result-ttl", type=float, default=d.result_ttl_s, metavar="S",
                        help=f"a deferred request's answer is kept this long (default {d.result_ttl_s:g})")
    parser.add_argument("--deferral-store", action="append", default=[], metavar="JURISDICTION=URL",
                        help="the only store(s) deferred requests of JURISDICTION may be kept in (repeat for more); "
                             "this router refuses to hold them unless its --state is one (default: any store)")


def settings_from(args: argparse.Namespace) -> DeferralSettings:
    """The settings ``add_arguments`` reads; ``ValueError`` naming the flag when one is wrong."""
    stores: dict[str, tuple[str, ...]] = {}
    for entry in args.deferral_store:
        code, _, url = entry.partition("=")
        code = code.strip().upper()
        if not code or not url:
            raise ValueError(f"--deferral-store: expected JURISDICTION=URL, got {entry!r}")
        stores[code] = (*stores.get(code, ()), url.strip())
    return DeferralSettings(max_held=args.deferral_max_held, max_bytes=args.deferral_max_bytes,
                            max_prompt_bytes=args.deferral_max_prompt_bytes, grace_s=args.deferral_grace,
                            result_ttl_s=args.deferral_result_ttl, store_url=args.state, stores=stores)
