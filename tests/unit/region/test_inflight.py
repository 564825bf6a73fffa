"""The gateway's accounts (``InFlight``): the batch of the replica that ran a request, the
pool's published running count, and the metered GPU energy split interval by interval (rule
"predicted-share-v1") on the real ``NvmlMeter`` over the fake NVML library: conservation in
every interval, shares in proportion to the predicted energy of each request's work, idle
energy apart, GPUs of one replica not billed to another's requests."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy.nvml import COUNTER_QUANTUM_J, READING_LAG_S, NvmlMeter
from scheduler.region.energy_report import PoolEnergyProfile, RegionPricing
from scheduler.region.inflight import UNCLAIMED, InFlight, MeasuredEnergy, RequestShare
from scheduler.region.replica_report import ReplicaReport, RunningIntegral, lifetime_batch
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml

POOL = "h100-chat"
MODEL = "llama-3.1-8b"


def pool_config() -> PoolConfig:
    return PoolConfig(name=POOL, gpu="H100-80GB", count=2, power_cap_w=700,
                      models=(ModelDeployment(name=MODEL, max_context=8192),))


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Replica:
    """A replica as its reports show it: its running count and the integral over time."""

    name: str
    clock: Clock
    gpus: tuple[int, ...] = ()
    node: str = ""
    integral: RunningIntegral = field(init=False)

    def __post_init__(self) -> None:
        self.integral = RunningIntegral(clock=self.clock)

    def report(self) -> ReplicaReport:
        at, running_s = self.integral.read()
        return ReplicaReport(self.name, self.node, self.gpus, self.integral.running, running_s, at)


@dataclass
class Metered:
    """The accounts with a meter: the real NvmlMeter over fake GPUs."""

    clock: Clock
    gpus: list[FakeGpu]
    flight: InFlight
    meter: NvmlMeter
    idle: list[tuple[str, float]]

    @classmethod
    def of(cls, gpus: int) -> Metered:
        clock = Clock()
        fakes = [FakeGpu(energy_mj=1_000_000 * (i + 1), power_mw=300_000) for i in range(gpus)]
        meter = NvmlMeter(library=FakeNvml(gpus=fakes), clock=clock)
        assert meter.open()
        idle: list[tuple[str, float]] = []
        flight = InFlight(clock=clock, pricing=RegionPricing({POOL: PoolEnergyProfile.of(pool_config())}),
                          on_idle=lambda pool, joules: idle.append((pool, joules)))
        metered = cls(clock, fakes, flight, meter, idle)
        metered.tick(0.0)  # the baseline reading
        return metered

    def spend(self, **joules_by_gpu: float) -> None:
        for name, joules in joules_by_gpu.items():
            self.gpus[int(name.removeprefix("gpu"))].energy_mj += round(joules * 1000)

    def tick(self, seconds: float = 0.2) -> None:
        self.clock.t += seconds
        reading = self.meter.read()
        assert reading is not None
        self.flight.meter(reading)

    def finish(self, request_id: str) -> RequestShare:
        return self.flight.finish(request_id, self.meter.read())

    def measured(self, request_id: str) -> MeasuredEnergy:
        measured = self.finish(request_id).measured
        assert measured is not None
        return measured


def place(flight: InFlight, replica: Replica, request_id: str, model: str = MODEL) -> None:
    flight.start(POOL, request_id, model)
    flight.report(request_id, replica.report())


# --- replica reports and the batch ---------------------------------------------------------


def test_a_report_travels_as_a_stream_item_and_back() -> None:
    report = ReplicaReport("LLMServer#abc", "node-1", (0, 1), running=12, running_s=345.5, at=17.25)
    assert ReplicaReport.of_batch([report.as_item()]) == report
    assert ReplicaReport.of_batch(['data: {"choices": []}\n\n']) is None
    assert ReplicaReport.of_batch([{"error": {"code": 400}}]) is None
    assert ReplicaReport.of_batch([report.as_item(), "data: [DONE]\n\n"]) is None
    with pytest.raises(ValueError, match="malformed replica report"):
        ReplicaReport.of_batch([{"x_replica": {"replica": "x"}}])


def test_the_running_integral_holds_each_step_s_count_until_the_next() -> None:
    clock = Clock(0.0)
    integral = RunningIntegral(clock=clock)
    clock.t = 1.0
    integral.update(4)  # idle until 1 s, then 4 running
    clock.t = 3.0
    integral.update(2)
    clock.t = 4.0
    assert integral.read() == (4.0, 4 * 2.0 + 2 * 1.0)


def test_the_batch_is_the_replica_s_running_count_averaged_over_the_request_s_lifetime() -> None:
    first = ReplicaReport("r", "", (), running=10, running_s=100.0, at=50.0)
    last = ReplicaReport("r", "", (), running=30, running_s=100.0 + 20 * 2.0 + 30 * 2.0, at=54.0)
    assert lifetime_batch(first, last) == pytest.approx(25.0)
    # Alone: the engine's count lags its first step, and the request itself ran.
    assert lifetime_batch(first, ReplicaReport("r", "", (), 0, 100.5, 51.0)) == 1.0
    assert lifetime_batch(first, first) == 10.0


def test_a_request_is_billed_the_batch_of_its_replica_not_the_pool_s_in_flight_count() -> None:
    clock = Clock()
    flight = InFlight(clock=clock)
    busy, quiet = Replica("busy", clock), Replica("quiet", clock)
    busy.integral.update(48)  # 48 running there, and 16 more waiting in its engine's queue
    for k in range(64):
        place(flight, busy, f"busy-{k}")
    place(flight, quiet, "mine")
    quiet.integral.update(1)
    clock.t += 3.0
    flight.report("mine", quiet.report())
    share = flight.finish("mine")
    assert share.replica == "quiet" and share.mean_batch == pytest.approx(1.0)
    assert share.measured is None and share.duration_s == pytest.approx(3.0)
    assert flight.count(POOL) == 64 and flight.started_total(POOL) == 65


def test_a_request_whose_replica_never_reported_is_billed_at_batch_one() -> None:
    flight = InFlight(clock=Clock())
    flight.start(POOL, "lost", MODEL)
    share = flight.finish("lost")
    assert share.mean_batch == 1.0 and share.replica is None


def test_the_published_running_count_adds_up_the_replicas_without_their_queues() -> None:
    clock = Clock()
    flight = InFlight(clock=clock)
    assert flight.running(POOL) is None
    a, b = Replica("a", clock), Replica("b", clock)
    a.integral.update(32)
    b.integral.update(2)
    for k in range(40):  # 32 running on a, 8 waiting in its engine's queue
        place(flight, a, f"a-{k}")
    for k in range(2):
        place(flight, b, f"b-{k}")
    flight.start(POOL, "not-placed-yet", MODEL)
    assert flight.running(POOL) == 34 and flight.count(POOL) == 43
    flight.finish("b-0")  # b's count is at most what this gateway still has there
    assert flight.running(POOL) == 33


def test_a_request_cannot_start_twice() -> None:
    flight = InFlight(clock=Clock())
    flight.start(POOL, "a", MODEL)
    with pytest.raises(ValueError, match="already in flight"):
        flight.start(POOL, "a", MODEL)


# --- measured energy ----------------------------------------------------------------------


def test_shares_follow_the_predicted_energy_of_each_request_s_tokens() -> None:
    m = Metered.of(gpus=1)
    replica = Replica("r0", m.clock, gpus=(0,))
    replica.integral.update(2)
    for request_id in ("fast", "slow"):
        place(m.flight, replica, request_id)
        m.flight.progress(request_id, 512, 1)
    m.spend(gpu0=40.0)
    m.tick()  # both prefilled the same prompt: equal shares
    m.flight.progress("fast", 512, 41)
    m.flight.progress("slow", 512, 21)
    m.spend(gpu0=90.0)
    m.tick()
    coefficients = PoolEnergyProfile.of(pool_config()).coefficients(MODEL, 2.0, 512 + (41 + 21) / 2)
    fast_j = coefficients.decode_joules(512, 41) - coefficients.decode_joules(512, 1)
    slow_j = coefficients.decode_joules(512, 21) - coefficients.decode_joules(512, 1)
    record = m.flight.intervals[-1]
    assert record.weighed_by == "predicted" and record.measured_j == pytest.approx(90.0)
    fast, slow = m.finish("fast"), m.finish("slow")
    assert fast.measured is not None and slow.measured is not None
    assert fast.measured.energy_j - 20.0 == pytest.approx(90.0 * fast_j / (fast_j + slow_j))
    assert (fast.measured.energy_j - 20.0) / (slow.measured.energy_j - 20.0) == pytest.approx(fast_j / slow_j)
    assert fast_j / slow_j == pytest.approx(2.0, rel=0.05)  # twice the tokens, about twice the energy
    assert fast.measured.prefill_j == pytest.approx(20.0) and fast.measured.decode_j == pytest.approx(
        90.0 * fast_j / (fast_j + slow_j))


def test_idle_intervals_are_counted_apart_and_billed_to_nobody() -> None:
    m = Metered.of(gpus=2)
    replica = Replica("r0", m.clock, gpus=(0,))
    m.spend(gpu0=15.0, gpu1=9.0)
    m.tick()  # nobody anywhere: GPU 0 not yet claimed either
    assert m.flight.idle_j == {UNCLAIMED: pytest.approx(24.0)}
    replica.integral.update(1)
    place(m.flight, replica, "late")
    m.flight.progress("late", 100, 1)
    m.spend(gpu0=30.0, gpu1=5.0)
    m.tick()
    share = m.finish("late")
    assert share.measured is not None and share.measured.energy_j == pytest.approx(30.0)  # not the idle 15 J before
    m.spend(gpu0=7.0)
    m.tick()  # GPU 0 idle, claimed by the replica of pool h100-chat
    assert m.flight.idle_j == {UNCLAIMED: pytest.approx(29.0), POOL: pytest.approx(7.0)}
    assert sorted((pool, round(joules, 6)) for pool, joules in m.idle) == [
        (POOL, 7.0), (UNCLAIMED, 5.0), (UNCLAIMED, 9.0), (UNCLAIMED, 15.0)]


def test_a_gpu_s_energy_goes_to_the_requests_of_the_replica_on_it_only() -> None:
    m = Metered.of(gpus=2)
    on_0, on_1 = Replica("r0", m.clock, gpus=(0,)), Replica("r1", m.clock, gpus=(1,))
    elsewhere = Replica("r2", m.clock, gpus=(0,), node="another-node")
    for replica, request_id in ((on_0, "a"), (on_1, "b"), (elsewhere, "c")):
        replica.integral.update(1)
        place(m.flight, replica, request_id)
        m.flight.progress(request_id, 100, 50)
    m.spend(gpu0=100.0, gpu1=1.0)
    m.tick()
    a, b, c = m.finish("a"), m.finish("b"), m.finish("c")
    assert a.measured is not None and a.measured.energy_j == pytest.approx(100.0)
    assert b.measured is not None and b.measured.energy_j == pytest.approx(1.0)
    assert c.measured is None  # its GPUs are not this node's: billed by the model


def test_replicas_that_cannot_name_their_gpus_share_the_unclaimed_ones() -> None:
    m = Metered.of(gpus=2)
    claims, unknown = Replica("r0", m.clock, gpus=(0,)), Replica("cpu-or-unknown", m.clock)
    for replica, request_id in ((claims, "a"), (unknown, "b")):
        replica.integral.update(1)
        place(m.flight, replica, request_id)
        m.flight.progress(request_id, 100, 10)
    m.spend(gpu0=10.0, gpu1=20.0)
    m.tick()
    a, b = m.finish("a"), m.finish("b")
    assert a.measured is not None and b.measured is not None
    assert (a.measured.energy_j, b.measured.energy_j) == (pytest.approx(10.0), pytest.approx(20.0))


def test_a_counter_that_did_not_move_keeps_its_interval_open() -> None:
    m = Metered.of(gpus=1)
    replica = Replica("r0", m.clock, gpus=(0,))
    replica.integral.update(1)
    place(m.flight, replica, "a")
    m.flight.progress("a", 100, 5)
    m.tick()  # the driver has not updated the counter: no interval
    assert not m.flight.intervals
    m.flight.progress("a", 100, 9)
    m.spend(gpu0=12.0)
    m.tick()
    assert [(r.start, r.end) for r in m.flight.intervals] == [(100.0, pytest.approx(100.4))]
    share = m.finish("a")
    assert share.measured is not None and share.measured.energy_j == pytest.approx(12.0)


def test_a_request_ending_closes_its_gpus_interval_so_its_last_tokens_count() -> None:
    m = Metered.of(gpus=1)
    replica = Replica("r0", m.clock, gpus=(0,))
    replica.integral.update(2)
    for request_id in ("ends", "goes-on"):
        place(m.flight, replica, request_id)
        m.flight.progress(request_id, 200, 1)
    m.spend(gpu0=10.0)
    m.tick()
    m.flight.progress("ends", 200, 30)
    m.flight.progress("goes-on", 200, 30)
    m.spend(gpu0=6.0)
    m.clock.t += 0.1
    ends = m.finish("ends")  # between two ticks: its own reading closes the interval
    assert ends.measured is not None and ends.measured.energy_j == pytest.approx(5.0 + 3.0)
    m.spend(gpu0=2.0)
    m.tick()
    goes_on = m.finish("goes-on")
    assert goes_on.measured is not None and goes_on.measured.energy_j == pytest.approx(5.0 + 3.0 + 2.0)


def test_the_interval_of_a_share_is_narrow_alone_and_wider_among_many() -> None:
    m = Metered.of(gpus=1)
    replica = Replica("r0", m.clock, gpus=(0,))
    replica.integral.update(1)
    place(m.flight, replica, "alone")
    for step in range(1, 26):
        m.flight.progress("alone", 512, 10 * step)
        m.spend(gpu0=60.0)
        m.tick()
    alone = m.measured("alone")
    lag_j = 300.0 * READING_LAG_S["counter"] + COUNTER_QUANTUM_J
    assert alone.model_error_j == 0.0
    assert alone.meter_error_j == pytest.approx(2 * lag_j)  # from 0 to all of it, and back to 0
    assert alone.meter_error_j / alone.energy_j < 0.05
    replica.integral.update(8)
    for k in range(8):
        place(m.flight, replica, f"many-{k}")
    for step in range(1, 26):
        for k in range(8):
            m.flight.progress(f"many-{k}", 512, (10 + k) * step)
        m.spend(gpu0=60.0)
        m.tick()
    one = m.measured("many-0")
    assert one.model_error_j / one.energy_j == pytest.approx(
        PoolEnergyProfile.of(pool_config()).ratio_error * (1 - one.energy_j / (25 * 60.0)), rel=0.2)


def test_every_interval_conserves_what_the_meter_measured() -> None:
    """Replicas on one GPU, on two, and of unknown GPUs, requests coming and going at random,
    counters that sometimes do not move: in every closed interval, attributed + idle =
    measured, and over the run the requests' bills plus the idle joules are the counters'
    total."""
    rng = random.Random(6)
    m = Metered.of(gpus=4)
    # GPU 3 is nobody's: the replica that cannot name its GPUs runs there.
    replicas = [Replica("r0", m.clock, gpus=(0,)), Replica("r1", m.clock, gpus=(1, 2)), Replica("r2", m.clock)]
    live: dict[str, tuple[int, int]] = {}
    billed, spent, serial = 0.0, 0.0, 0
    for _ in range(600):
        if rng.random() < 0.3 or not live:
            replica = rng.choice(replicas)
            replica.integral.update(replica.integral.running + 1)
            serial += 1
            request_id = f"q{serial}"
            place(m.flight, replica, request_id)
            live[request_id] = (rng.randint(1, 4000), 0)
        for request_id, (prompt, done) in list(live.items()):
            if rng.random() < 0.7:
                live[request_id] = (prompt, done + rng.randint(0, 12))
                m.flight.progress(request_id, prompt, live[request_id][1])
        joules = {f"gpu{g}": rng.choice([0.0, rng.uniform(0, 140)]) for g in range(4)}
        m.spend(**joules)
        spent += sum(round(j * 1000) for j in joules.values()) / 1000
        if rng.random() < 0.2:
            request_id = rng.choice(list(live))
            del live[request_id]
            share = m.finish(request_id)
            billed += share.measured.energy_j if share.measured is not None else 0.0
        else:
            m.tick(rng.uniform(0.05, 0.3))
    for request_id in list(live):
        share = m.finish(request_id)
        billed += share.measured.energy_j if share.measured is not None else 0.0
    closed = list(m.flight.intervals)
    assert len(closed) == 256  # the history kept
    for record in closed:
        assert record.attributed_j + record.idle_j == pytest.approx(record.measured_j, rel=1e-12)
    m.tick()
    assert billed + sum(m.flight.idle_j.values()) == pytest.approx(spent, rel=1e-9)
    assert m.flight.attributed_j == pytest.approx(billed, rel=1e-9)
