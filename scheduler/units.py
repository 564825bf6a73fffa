"""Unit conversions, each defined once for every part that uses it (the scorers, the receipts,
the ledger, the capacity planner, the deferral window, the carbon store, the simulator). It
imports nothing, so any part of ``scheduler`` may import it."""

from __future__ import annotations

J_PER_KWH = 3.6e6
HOUR_S = 3600.0
DAY_S = 86400.0
