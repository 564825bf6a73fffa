"""Workflow workloads (scheduler.sim.workflow): per shape, the counts, the shared prefix, the
arrival structure and what each request can reuse; the chain and DAG dependency timing in a
simulation."""

from __future__ import annotations

import math

import pytest

from scheduler.sim.workflow import build_workflow_workload
from scheduler.sim.workflow_spec import SPREAD_S, SUFFIX_TOKENS, THINK_S, WorkflowSpec
from scheduler.sim.workload import RequestFactory, Workload, WorkloadConfig, load_trace
from tests.unit.sim.kit import OSLO, START, Files, europe_only, policy, region
from tests.unit.sim.workflows import run

T0 = START.timestamp()


def workload(files: Files, shape: str, hours: float = 0.05, rate: float = 1.0) -> Workload:
    config = WorkloadConfig(start=T0, hours=hours, rate=rate, continents=europe_only(), prefix_share=0.0)
    return build_workflow_workload(load_trace(str(files.trace)), config, WorkflowSpec.parse(shape), seed=4)


def suffix_ok(tokens: int) -> bool:
    return SUFFIX_TOKENS[0] <= tokens <= SUFFIX_TOKENS[1]


@pytest.mark.timeout(20)
def test_fanout_siblings_arrive_together_and_share_the_prefix(files: Files) -> None:
    w = workload(files, "fanout:8:4096")
    flows = w.workflows
    assert flows is not None
    n_workflows = 180  # 0.05 h at one workflow a second
    assert len(w) == 8 * n_workflows
    assert sorted(flows.roots) == list(range(len(w)))  # no sibling waits on another
    assert [w.arrival_s[i] for i in flows.roots] == sorted(w.arrival_s)
    requests = RequestFactory(w)
    anonymous = RequestFactory(w, workflow_ids=False)
    for f in range(n_workflows):
        rows = range(8 * f, 8 * f + 8)
        times = [w.arrival_s[m] for m in rows]
        assert times[0] == pytest.approx(T0 + f)  # the trace's one-a-second arrivals
        assert 0.0 <= max(times) - min(times) <= SPREAD_S
        assert len({w.city[m] for m in rows}) == 1  # one client
        for m in rows:
            r = requests.request(m)
            assert r.prefix_key == r.workflow_id == f"wf-{f}"
            assert r.workflow_shape == "fanout" and r.holdable
            assert r.shared_prefix_tokens == 4096 == w.prefix_tokens[m] == flows.leaves[m]
            assert suffix_ok(r.prompt_tokens - 4096)
            assert not flows.after[m] and not flows.children[m]
            # The baseline's requests: the same, without the workflow id.
            assert anonymous.request(m).workflow_id is None
            assert anonymous.request(m).prefix_key == r.prefix_key


@pytest.mark.timeout(20)
def test_a_chains_steps_extend_the_last_prompt_and_wait_on_it(files: Files) -> None:
    w = workload(files, "chain:4:2048")
    flows = w.workflows
    assert flows is not None
    assert len(w) == 4 * 180
    assert flows.roots == list(range(0, len(w), 4))  # only the first steps arrive on their own
    requests = RequestFactory(w)
    for f in range(180):
        first = 4 * f
        assert suffix_ok(w.prompt_tokens[first] - 2048)
        assert w.prefix_tokens[first] == 2048
        for k in range(1, 4):
            m = first + k
            assert flows.after[m] == (m - 1,) and flows.children[m - 1] == (m,)
            assert math.isnan(w.arrival_s[m])  # timed by the simulation
            turn = w.prompt_tokens[m] - w.prompt_tokens[m - 1] - w.output_tokens[m - 1]
            assert suffix_ok(turn)
            # What it reuses is its predecessor's whole context, which that one left warm.
            assert w.prefix_tokens[m] == w.prompt_tokens[m - 1] + w.output_tokens[m - 1] == flows.leaves[m - 1]
            assert THINK_S[0] <= flows.think_s[m] <= THINK_S[1]
            r = requests.request(m)
            assert r.workflow_shape == "chain" and not r.holdable
            assert r.shared_prefix_tokens is None


@pytest.mark.timeout(20)
def test_a_dags_join_waits_on_every_sibling_and_reads_their_outputs(files: Files) -> None:
    w = workload(files, "dag:5:4096")
    flows = w.workflows
    assert flows is not None
    assert len(w) == 5 * 180
    assert len(flows.roots) == 4 * 180
    for f in range(180):
        siblings, join = list(range(5 * f, 5 * f + 4)), 5 * f + 4
        assert flows.after[join] == tuple(siblings)
        assert all(flows.children[s] == (join,) for s in siblings)
        assert w.prompt_tokens[join] == 4096 + sum(w.output_tokens[s] for s in siblings)
        assert w.prefix_tokens[join] == 4096 == flows.shared_prefix[join]
        assert all(suffix_ok(w.prompt_tokens[s] - 4096) for s in siblings)
        assert math.isnan(w.arrival_s[join])
    assert not RequestFactory(w).request(4).holdable


@pytest.mark.timeout(20)
@pytest.mark.parametrize("shape", ["chain:4:2048", "dag:5:4096"])
def test_a_waiting_step_arrives_its_think_time_after_the_last_predecessor_reached_the_client(
        files: Files, shape: str) -> None:
    regions = (region("only", "CLEAN", OSLO),)
    result = run(files, regions, policy(), shape, hours=0.02, rate=0.5)
    f = result.workflow
    steps = WorkflowSpec.parse(shape).steps
    assert result.requests == result.ran == steps * f["workflows"] > 0
    assert f["workflows_complete"] == f["workflows"]
    assert f["workflow_steps_never_arrived"] == 0
    # Measured by the simulation: arrival - the last token of the last predecessor at the client.
    assert THINK_S[0] <= f["workflow_step_gap_min_s"] <= f["workflow_step_gap_max_s"] <= THINK_S[1]
    # A chain of 4 takes at least its three think times; a DAG its one.
    assert f["workflow_latency_p50_s"] > (steps - 1 if shape.startswith("chain") else 1) * THINK_S[0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("value", "message"), [
    ("fanout:0:4096", "N >= 1"), ("star:8:1", "SHAPE must be one of"), ("fanout:8", "three parts"),
    ("dag:1:64", "N >= 2"), ("chain:4:0", "TOKENS >= 1"), ("chain:x:64", "invalid literal"),
])
def test_bad_specs_are_refused_naming_the_value(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        WorkflowSpec.parse(value)
    assert repr(value) in str(caught.value)
