"""The deferral soak (scripts/deferral_soak.py), run small: a flooding tenant and nine batch
tenants on the real Redis, the clock fast-forwarded; the deferral's memory stays within the
tenants' caps and flat once the holds and answers turn over, the flood is refused, and the
soak's namespace is gone afterwards. docs/deferral.md has a full run's figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
MAX_BYTES = 4 * 2**20
TENANTS = 10


def test_a_small_soak_keeps_the_deferral_within_its_caps(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "deferral_soak.py"), "--redis", REDIS_URL, "--hours", "2",
         "--rate", "1", "--speed", "120", "--sample-hours", "0.25", "--max-bytes", str(MAX_BYTES),
         "--flood-prompt-bytes", str(64 * 1024), "--result-ttl", "1800", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    samples = report["samples"]
    assert report["bounded"] and len(samples) >= 9
    assert report["lag_s"] < 600  # well under the shortest TTL (15 min): the TTLs kept pace
    counts = report["counts"]
    assert counts["refused flood"] > 0 and counts.get("refused batch", 0) == 0
    assert counts["answered"] > 0.8 * counts["submitted"] / 2 and counts["deleted"] > 0
    late = [s["deferral_bytes"] for s in samples[len(samples) // 2:]]
    # Within the caps, and flat: the second half moves by less than a fifth of its mean.
    assert max(late) <= TENANTS * MAX_BYTES
    assert 0.5 * MAX_BYTES < max(s["flood_bytes"] for s in samples) <= MAX_BYTES  # the flood, held at its cap
    assert max(late) - min(late) < 0.2 * sum(late) / len(late), late
    # The queue's own count of what it keeps agrees with Redis's within a quarter.
    last = samples[-1]
    assert 0.75 < last["accounted_bytes"] / last["deferral_bytes"] < 1.25
    namespace = run.stdout.split("namespace ", 1)[1].split()[0]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert list(client.scan_iter(match=f"sched:{namespace}:*", count=1000)) == []
    finally:
        client.close()
