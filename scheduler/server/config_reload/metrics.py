"""The reloader's samples on /metrics (docs/hot-reload.md): the version in use, the reloads
and refusals counted, whether the version is signed and published, the last attempt's problems."""

from __future__ import annotations

from scheduler.server.config_reload.reloader import ConfigReloader
from scheduler.server.config_signing import INVALID, SIGNATURE_REASONS
from scheduler.server.metrics import Sample

# Problems shown on /metrics (the first of the last failed attempt).
MAX_PROBLEM_SAMPLES = 20


def config_samples(reloader: ConfigReloader) -> list[Sample]:
    """The reloader's gauges and counters, read at scrape time."""
    version, signature = reloader.version, reloader.signature
    out: list[Sample] = [
        ("scheduler_config_version_info", {"version": version.label, "source": reloader.source}, 1.0),
        ("scheduler_config_version_counter", {}, float(version.counter)),
        ("scheduler_config_last_reload_ok", {}, 0.0 if reloader.problems else 1.0),
        ("scheduler_config_unpublished", {}, 0.0 if reloader.published else 1.0),
    ]
    for (trigger, result), count in sorted(reloader.counts.items()):
        out.append(("scheduler_config_reloads_total", {"trigger": trigger, "result": result}, float(count)))
    # Every reason from the start (at 0): an alert's increase() sees the first refusal.
    for reason in (*SIGNATURE_REASONS, INVALID):
        out.append(("scheduler_config_rejected_total", {"reason": reason}, float(reloader.rejected[reason])))
    out.append(("scheduler_config_signed", {"key_id": signature.key_id if signature is not None else ""},
                1.0 if signature is not None else 0.0))
    for issue in reloader.problems[:MAX_PROBLEM_SAMPLES]:
        out.append(("scheduler_config_problem",
                    {"file": issue.file, "field": issue.field, "message": issue.message[:200]}, 1.0))
    return out
