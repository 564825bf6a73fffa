"""The energy gate end to end: ``scheduler gate measure`` against a local region three times (twice
with the same config, then with the engine's batch limit cut from 8 to 2 under 8 concurrent
streams), and ``scheduler gate compare``: zero on the same config twice, non-zero on the
smaller batch limit with every bucket named as risen.

Real: the region gateway's code (its request path, ``InFlight``'s split of the metered GPU
joules among the requests on the GPU by rule predicted-share-v1, the receipts' energy object
and its interval), HTTP on port 0, the ``scheduler`` command. Not real (local_region.py): the
engine, a continuous-batching fake whose steps charge a fake NVML energy counter (the weights
once per step, shared by the batch), and so the GPU; and the counter's lag, set to the fake's
step (its counter moves every step) instead of a real GPU's 0.1 s, which in the fake's
compressed time would swamp every receipt.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.energy import nvml
from scheduler.plugins.checked_fleet import load_checked_fleet
from tests.integration.gate.local_region import STEP_S, LocalRegion

pytestmark = pytest.mark.integration

QUICK_SET = Path(__file__).with_name("quick_set.yaml")
POOL = "h100-chat"


def measure(max_num_seqs: int, out: Path) -> dict[str, object]:
    region = next(r for r in load_checked_fleet().regions if r.name == "us-east")
    with LocalRegion(region, POOL, max_num_seqs=max_num_seqs) as local:
        code = main(["gate", "measure", "--against", local.url, "--pool", POOL, "--requests", str(QUICK_SET),
                     "--out", str(out), "--label", f"max_num_seqs {max_num_seqs}", "--quiet"])
    assert code == 0
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.mark.timeout(120)
def test_compare_passes_the_same_config_and_fails_a_smaller_batch_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(nvml.READING_LAG_S, nvml.COUNTER, STEP_S)
    baseline = measure(8, tmp_path / "baseline.json")
    again = measure(8, tmp_path / "again.json")
    smaller = measure(2, tmp_path / "smaller.json")
    print(capsys.readouterr().out)

    for result in (baseline, again, smaller):
        buckets = result["buckets"]
        assert isinstance(buckets, dict) and set(buckets) == {"short-chat", "long-context", "long-output", "fan-out"}
        for b in buckets.values():
            assert b["n"] >= 16 and b["sources"] == {"nvml": b["n"]} and b["places"] == {f"us-east/{POOL}": b["n"]}
            assert b["attribution_methods"] == {"predicted-share-v1": b["n"]}
            assert b["low_j_per_token"] < b["mean_j_per_token"] < b["high_j_per_token"]
    # The batch the receipts say: near 8 with the limit at 8, 2 with it at 2.
    batches = {name: [s["batch_size"] for s in b["samples"]] for name, b in smaller["buckets"].items()}  # type: ignore[attr-defined]
    assert all(max(values) <= 2.05 for values in batches.values())
    wide = [s["batch_size"] for b in baseline["buckets"].values() for s in b["samples"]]  # type: ignore[attr-defined]
    assert sum(wide) / len(wide) > 4

    assert main(["gate", "compare", str(tmp_path / "baseline.json"), str(tmp_path / "again.json"),
                 "--max-increase", "5%"]) == 0
    same = capsys.readouterr().out
    assert "gate PASSED" in same and "ROSE" not in same
    # Every receipt metered: the line that marks the pool passed in a policy's telemetry gate.
    digest = hashlib.sha256((tmp_path / "again.json").read_bytes()).hexdigest()
    assert f"- {{pool: us-east/{POOL}, measurement_sha256: {digest}}}" in same

    assert main(["gate", "compare", str(tmp_path / "baseline.json"), str(tmp_path / "smaller.json"),
                 "--max-increase", "5%"]) == 1
    rose = capsys.readouterr().out
    print(same, rose, sep="\n")
    for name in ("short-chat", "long-context", "long-output", "fan-out"):
        (line,) = [line for line in rose.splitlines() if line.startswith(name)]
        assert " ROSE " in line
    assert "gate FAILED: energy per token rose" in rose
