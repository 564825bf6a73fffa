"""Everything with I/O that feeds the snapshot: stores, carbon providers, region state."""
