"""Workflows in the simulated workload (issue 15): chains, fan-outs and DAGs of requests that
share a prefix, ``--workflow SHAPE:N:TOKENS``.

Each arrival of the tiled trace (``scheduler.sim.workload.arrivals``: the trace's own times,
scaled to ``--rate``, here workflows per second) starts one workflow. Its requests share the
client, residency rule and workload class drawn for it, one ``workflow_id`` (``wf-<w>``) and
one prefix key (``wf-<w>``). Request m of the workload (workflow w, step k, m = w N + k) takes
the output length of trace row m mod n, so the trace's output lengths are kept. T = TOKENS,
s ~ uniform integers in ``suffix_tokens`` (a sibling's own question, a chain's new user turn),
think ~ uniform in ``think_s`` (the client's time between a step's last token and its next
request), out_k the output tokens of step k:

    fanout  N siblings at start + u_k, u_0 = 0, u_k ~ U(0, spread_s) (sorted: a few ms apart)
            prompt_k = T + s_k; shared_prefix_tokens = T; reusable on a warm replica: T
    chain   step 0 at start, prompt_0 = T + s_0
            step k + 1 when step k's last token reached the client (done + RTT) + think
            prompt_(k+1) = prompt_k + out_k + s_(k+1); shared_prefix_tokens = None (the whole
            previous prompt is shared); reusable: prompt_k + out_k
    dag     N - 1 siblings as a fan-out, then a join when the last of them reached the client
            + think: prompt = T + sum of the siblings' outputs; shared_prefix_tokens = T;
            reusable: T (the siblings' outputs follow their own suffixes, not the prefix)

What a request leaves warm under its key on the replica it ran on (``WorkflowColumns.leaves``):
T for a sibling or a join, prompt_k + out_k for a chain's step (its whole context).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.sim.report import PolicyResult
from scheduler.sim.workflow_spec import WorkflowColumns, WorkflowSpec
from scheduler.sim.workload import Trace, Workload, WorkloadConfig, arrivals, draw_clients


def build_workflow_workload(trace: Trace, config: WorkloadConfig, spec: WorkflowSpec, seed: int) -> Workload:
    """The workflows of ``spec`` starting at the tiled trace's arrivals (module docstring)."""
    rng = np.random.default_rng(seed)
    start, _ = arrivals(trace, config)
    n_workflows = len(start)
    clients = draw_clients(config, n_workflows, rng)
    steps, t = spec.steps, spec.prefix_tokens
    shape = (n_workflows, steps)
    rows = np.arange(n_workflows * steps).reshape(shape)
    out = trace.output_tokens[rows % len(trace.output_tokens)]
    low, high = spec.suffix_tokens
    suffix = rng.integers(low, high + 1, size=shape)
    think = rng.uniform(*spec.think_s, size=shape)
    offset = np.sort(rng.uniform(0.0, spec.spread_s, size=shape), axis=1)
    offset[:, 0] = 0.0

    arrival = start[:, None] + offset
    shared = np.full(shape, t, dtype=np.int64)
    reusable = np.full(shape, t, dtype=np.int64)
    prompt = t + suffix
    leaves = np.full(shape, t, dtype=np.int64)
    after: list[tuple[int, ...]] = [()] * (n_workflows * steps)
    root = np.ones(shape, dtype=bool)
    if spec.shape == "chain":
        # prompt_k = T + s_0 + ... + s_k + out_0 + ... + out_(k-1)
        prompt = t + np.cumsum(suffix, axis=1) + np.cumsum(out, axis=1) - out
        leaves = prompt + out
        reusable[:, 1:] = leaves[:, :-1]
        shared[:] = -1
        root[:, 1:] = False
        arrival[:, 1:] = np.nan
        for m in rows[:, 1:].ravel().tolist():
            after[m] = (m - 1,)
    elif spec.shape == "dag":
        prompt[:, -1] = t + out[:, :-1].sum(axis=1)
        root[:, -1] = False
        arrival[:, -1] = np.nan
        for w in range(n_workflows):
            first = w * steps
            after[first + steps - 1] = tuple(range(first, first + steps - 1))
    children: list[list[int]] = [[] for _ in after]
    for m, parents in enumerate(after):
        for parent in parents:
            children[parent].append(m)
    roots = rows[root]
    roots = roots[np.argsort(arrival.ravel()[roots], kind="stable")]

    def per_row(values: np.ndarray) -> list[int]:
        repeated: list[int] = np.repeat(values, steps).tolist()
        return repeated

    return Workload(
        model=config.model,
        arrival_s=arrival.ravel().tolist(),
        prompt_tokens=prompt.ravel().tolist(),
        output_tokens=out.ravel().tolist(),
        city=per_row(clients.city_of),
        restricted=np.repeat(clients.restricted, steps).tolist(),
        workload_class=per_row(clients.classes),
        prefix_group=per_row(np.arange(n_workflows)),
        prefix_tokens=reusable.ravel().tolist(),
        cities=clients.cities,
        city_jurisdiction=clients.city_jurisdiction,
        deferrable_deadline_s=config.deferrable_deadline_s,
        workflows=WorkflowColumns(
            spec=spec,
            shared_prefix=shared.ravel().tolist(),
            leaves=leaves.ravel().tolist(),
            after=after,
            children=[tuple(c) for c in children],
            think_s=think.ravel().tolist(),
            roots=roots.tolist(),
        ),
    )


def figures(columns: WorkflowColumns, ran_pool: Sequence[int], arrival: Sequence[float],
            latency_s: np.ndarray) -> dict[str, Any]:
    """The workflows' figures of one run (``latency_s``: each request's arrival to its last
    token at the client, NaN where it never ran):

    - how many workflows, how many ran every step, the share of those whose steps all ran in
      one pool, and the steps that never arrived (a predecessor never ran);
    - a complete workflow's latency: its first arrival to the last token of its last request
      at the client (p50, p99);
    - the gap of each waiting step: its arrival - the last token of the last of its
      predecessors at the client (the client's think time; min and max)."""
    steps = columns.spec.steps
    pools = np.asarray(ran_pool, dtype=np.int64).reshape(-1, steps)
    complete = (pools >= 0).all(axis=1)
    one_pool = complete & (pools == pools[:, :1]).all(axis=1)
    n_complete = int(complete.sum())
    arrived = np.asarray(arrival, dtype=float)
    at_client = arrived + latency_s
    span = (at_client.reshape(-1, steps).max(axis=1) - arrived.reshape(-1, steps).min(axis=1))[complete]
    gaps = [arrived[m] - max(at_client[p] for p in parents)
            for m, parents in enumerate(columns.after) if parents and not math.isnan(arrived[m])]

    def pct(values: np.ndarray, q: float) -> float | None:
        return float(np.percentile(values, q)) if len(values) else None

    return {
        "workflows": len(pools),
        "workflows_complete": n_complete,
        "workflows_in_one_pool_share": float(one_pool.sum() / n_complete) if n_complete else 0.0,
        "workflow_steps_never_arrived": int(np.isnan(arrived).sum()),
        "workflow_latency_p50_s": pct(span, 50),
        "workflow_latency_p99_s": pct(span, 99),
        "workflow_step_gap_min_s": min(gaps, default=None),
        "workflow_step_gap_max_s": max(gaps, default=None),
    }


# What a comparison reports both ways (suffix _affinity and _no_affinity).
COMPARED = (
    "j_per_output_token", "j_per_output_token_with_idle", "j_per_request", "gco2e_per_request", "prefix_hit_share",
    "ttft_p50_ms", "ttft_p99_ms", "slo_attainment", "workflows_in_one_pool_share", "workflow_latency_p50_s",
    "workflow_latency_p99_s",
)


def merge_affinity(with_affinity: PolicyResult, without: PolicyResult) -> PolicyResult:
    """The affinity run's result, its workflow figures joined by both runs' ``COMPARED``
    figures and the ratio j_per_output_token_no_affinity / j_per_output_token_affinity."""
    merged = dict(with_affinity.workflow)
    for key in COMPARED:
        for suffix, result in (("affinity", with_affinity), ("no_affinity", without)):
            value = result.workflow[key] if key in result.workflow else getattr(result, key)
            merged[f"{key}_{suffix}"] = value
    with_j, without_j = with_affinity.j_per_output_token, without.j_per_output_token
    merged["j_per_output_token_ratio"] = without_j / with_j if with_j > 0 else None
    return dataclasses.replace(with_affinity, workflow=merged)
