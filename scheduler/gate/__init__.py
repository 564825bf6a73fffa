"""The energy release gate (docs/gate.md): ``scheduler gate measure`` runs a standard request
set through a router or a region and records J per output token per bucket from the
receipts; ``scheduler gate compare`` fails a candidate whose J/token rose past a threshold
beyond the measurement interval, or whose quality scores dropped."""
