"""scheduler.testing's REPL example runs as its docstring shows (a fleet, signals and a request
in a few lines, decided by the real Scheduler)."""

from __future__ import annotations

import doctest

import scheduler.testing


def test_the_docstring_example_runs() -> None:
    result = doctest.testmod(scheduler.testing, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0
