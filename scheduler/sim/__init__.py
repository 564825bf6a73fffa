"""Trace-driven discrete-event simulation of a fleet under a routing policy.

The simulator replays a request trace against the regions of ``regions/``, building the
same ``FleetSnapshot`` the router builds (``scheduler.datalayer.snapshot``) on the
simulator's clock about once a simulated second, and asks the same
``Scheduler.schedule(request, snapshot)`` where each request runs. Pools queue and batch
requests continuously; carbon signals are replayed from hourly CSV files; outcomes
(energy, carbon, TTFT, compliance) are measured by the simulator itself, not taken from the
scheduler's predictions.
"""
