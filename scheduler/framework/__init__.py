"""The scheduling framework: plugin protocols, the registry and the Scheduler."""
