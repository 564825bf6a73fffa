"""Energy unit conversions, defined once for every part that turns joules into kWh (the carbon
and price scorers, the receipts, the ledger, the capacity planner, the simulator)."""

from __future__ import annotations

J_PER_KWH = 3.6e6
