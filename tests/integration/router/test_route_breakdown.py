"""``scripts/route_breakdown.py``, run tiny: the bench's processes with our router started
through the script's entry point, a second of direct-mode requests, and the router's thread
CPU per step read back from the router. Checks that every step was timed on every request and
that nested steps cost no more than the step around them; no figure is compared against a
time (the machine is shared)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "route_breakdown.py"
ROW = re.compile(r"^( *)(\S.*?)\s+([\d,.]+)\s+([\d,]+)$")


def test_every_step_is_timed_on_every_request() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "1", "--warmup", "10", "--repeat-schedule"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    head, *rows = result.stdout.strip().splitlines()
    count = re.search(r"([\d,]+) Routes", head)
    assert count and re.search(r"router CPU per Route \(/proc\): [\d,.]+ us", head), head
    routes = int(count.group(1).replace(",", ""))
    assert routes > 0
    steps = {}
    for row in rows[1:]:
        match = ROW.match(row)
        assert match, row
        steps[match.group(2)] = (float(match.group(3).replace(",", "")), int(match.group(4).replace(",", "")))
    assert set(steps) == {"HTTP request (whole callback)", "Route handler", "decision + tickets", "decide",
                          "request conversion", "Scheduler.schedule", "record the dispatch",
                          "(the same decision again)", "(and a third time)", "answer proto", "socket write"}
    # The warm-up's requests are timed too: every step ran once per request.
    assert {calls for _, calls in steps.values()} == {routes + 10}
    us = {name: value for name, (value, _) in steps.items()}
    assert 0 < us["decide"] <= us["decision + tickets"] <= us["Route handler"] <= us["HTTP request (whole callback)"]
    assert us["Scheduler.schedule"] + us["request conversion"] <= us["decide"]
