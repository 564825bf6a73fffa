"""A canary of the router's policy, with automatic rollback (docs/canary.md).

A policy's ``canary:`` section names another policy (the arm) and the fraction of the traffic it
decides for. The parts:

- ``policy``: the policy the arm decides under: its objective, the control's hard limits;
- ``assign``: which arm a request gets (a stable hash of its tenant or id) and the snapshot
  that arm decides on: a pure function of (request, snapshot), so the decision stays one too;
- ``stats``: the figures per arm and window (TTFT-SLO attainment, error and retry rates, J and
  gCO2e per request) and the rollback rule over them;
- ``runtime``: what a router runs: its proxied streams counted into windows in the shared
  store (off the request path, batched), the windows and the arm's on/off state read with
  every snapshot refresh (0.5 s), a crossed bound turning the arm off for every router, an
  admin's re-enable;
- ``cli``: ``scheduler canary status | enable | disable`` over the RouterAdmin RPCs.

Below the data layer and the server (which use it); it imports neither.
"""
