"""Trace-driven discrete-event simulation of a fleet under a routing policy.

The simulator replays a request trace against the regions of ``regions/``, building the
same ``FleetSnapshot`` the router builds (``scheduler.datalayer.snapshot``) on the
simulator's clock about once a simulated second, and asks the same
``Scheduler.schedule(request, snapshot)`` where each request runs. Each pool's replicas run
as vLLM schedules, iteration by iteration (``scheduler.sim.replica``), at the pool's true
step costs (``scheduler.sim.truth``); carbon signals are replayed from hourly CSV files;
outcomes (energy, carbon, TTFT, queueing, compliance) are measured by the simulator itself
and set beside what the scheduler predicted. Deferrable requests with a deadline wait in a
deferral queue for the lowest-carbon window of a seeded, noisy forecast
(``scheduler.sim.deferral``, ``scheduler.sim.forecast``).
"""
