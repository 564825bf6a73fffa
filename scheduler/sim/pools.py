"""Simulated pools: R vLLM replicas behind a power-of-two-choices router.

A pool serving the simulated model has R = count // tensor_parallel replicas, each an
iteration-level vLLM replica (``scheduler.sim.replica``) running at the pool's true step
costs (``scheduler.sim.truth``). A request sent to the pool goes to one replica, chosen as
Ray Serve's default request router does: two distinct replicas drawn at random (a seeded RNG
per pool), the one with fewer requests waiting + running wins (the first drawn on a tie).

With ``prefix_aware`` (the simulator's affinity runs) the pool routes prefix-aware, an
approximation of the region app's ``PrefixKeyRouter`` (scheduler.region.prefix_router, which
sends a key to its rendezvous home unless that replica is overloaded): it remembers the
replica it last sent each prefix key to (at most ``PREFIX_ENTRIES_PER_REPLICA`` x R keys,
least recently sent dropped first), and a request with that key goes there when that
replica can run it without queueing behind its limits:

    running + waiting + 1 <= max_num_seqs   and   KV reserved + waiting reservations + its own <= KV capacity

(it then joins the replica's batch as soon as the step token budget allows); otherwise the
power-of-two choice above (the pool's balance rule), which becomes the key's replica. The
two random draws are made either way, so both runs of a comparison draw the same numbers.

What the pool publishes (its replicas summed, as vLLM's metrics are summed over a pool):

    queue_depth    = sum of waiting requests
    running        = sum of running sequences (prefilling or decoding)
    kv_cache_usage = sum of KV tokens held / (R x KV capacity per replica)
    replicas       = the warm replicas taking requests (R without autoscaling), and
    starting_replicas = those in their cold start: as Ray Serve's deployment status reports
                   them to the region's publisher (scheduler.region.warmth), so that the router
                   sees a pool at zero as cold or starting and prices its cold start
    prefix_cache_hit_rate = hits / lookups of the replicas' prefix caches since the start
    arrival_rate, prompt_tokens_rate = requests and their prompt tokens sent to the pool per
                   second, averaged exponentially over ``RATE_WINDOW_S`` (one publication
                   interval alone is too noisy: 10 requests a second vary by a third)

Tokens held are counted at each replica's last scheduling event: a decode run in progress
adds its tokens when it ends.

Autoscaling (``scheduler.sim.autoscale``; without it every replica is warm for the whole run):
``replicas`` are the warm replicas that take requests; ``scale_to`` starts replicas (cold
for ``cold_start_s``, then ``ready``) or retires them (starting ones first, then the warm ones
with the fewest requests: they take nothing new, finish what they hold, and stop at the
first ``stop_drained`` after they are empty). A request sent while no replica is warm waits
in ``held`` (counted in the published queue depth) until one is ready. ``warm_s`` integrates
the replicas that draw power as warm ones (taking requests or draining) over time.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable

from scheduler.datalayer.snapshot import replicas_of
from scheduler.energy.step import StepCosts
from scheduler.sim.autoscale import PoolAutoscaler, PoolAutoscaling
from scheduler.sim.replica import PREFIX_ENTRIES_PER_REPLICA, KvKnee, Replica, Seq, Totals
from scheduler.sim.slots import slot_setters
from scheduler.types import Candidate, Decision, PoolLiveState, Request

# Time constant of the published arrival rates' moving average.
RATE_WINDOW_S = 10.0


class Job(Seq):
    """A request on its way through the fleet, and what the scheduler predicted for it."""

    __slots__ = ("decision", "pool", "predicted_j", "predicted_ttft_s", "rank", "request", "row", "rtt_s")

    def __init__(self, row: int, request: Request, arrived: float, prefix_tokens: int, decision: Decision,
                 leaves: int | None = None) -> None:
        super().__init__(arrived, request.prompt_tokens, request.max_tokens, request.prefix_key, prefix_tokens, leaves)
        self.row = row
        self.request = request
        # Dispatch walks the decision's ranking; failover moves down it.
        self.decision = decision
        self.rank = 0
        self.pool: PoolSim | None = None
        self.predicted_j = 0.0
        self.predicted_ttft_s = 0.0
        self.rtt_s = 0.0


class PoolSim:
    __slots__ = ("_arrivals", "_hit_rate", "_knee", "_live", "_on_done", "_prompt_tokens", "_rng", "_tree",
                 "_tree_size", "_warm_since", "_window_start", "autoscaler", "candidate", "cold_start_j", "cold_starts",
                 "costs", "down", "every", "held", "number", "prefix_aware", "replicas", "starting", "stopping",
                 "totals", "warm_s")

    def __init__(self, candidate: Candidate, costs: StepCosts, on_done: Callable[[Seq], None], seed: int = 0,
                 prefix_aware: bool = False, number: int = 0, knee: KvKnee | None = None,
                 autoscaling: PoolAutoscaling | None = None, start: float = 0.0) -> None:
        """``costs`` and ``knee``: the true step costs and KV knee of one replica of this pool;
        ``number``: its index among the simulation's pools; ``autoscaling``: the pool's
        autoscaler settings (None: every replica warm throughout); ``start``: when its
        replicas' warm time begins."""
        self.candidate = candidate
        self.number = number
        self.costs = costs
        self.totals = Totals()
        self._on_done = on_done
        self._knee = knee
        size = replicas_of(candidate)
        self.autoscaler = None if autoscaling is None else PoolAutoscaler(autoscaling, size)
        warm = size if self.autoscaler is None else self.autoscaler.target
        self.replicas = [Replica(costs, on_done, self.totals, knee=knee) for _ in range(warm)]
        # every replica the run made (accounting), those starting (ready time, replica) and draining
        self.every = list(self.replicas)
        self.starting: list[tuple[float, Replica]] = []
        self.stopping: list[Replica] = []
        self.held: list[Seq] = []
        self.warm_s = 0.0
        self._warm_since = start
        self.cold_starts = 0
        self.cold_start_j = 0.0
        self.down = False
        self.prefix_aware = prefix_aware
        # prefix key -> the replica it was last sent to (least recently sent first)
        self._tree: OrderedDict[str, Replica] = OrderedDict()
        self._tree_size = PREFIX_ENTRIES_PER_REPLICA * size
        self._rng = random.Random(f"{seed}:{candidate.region.name}/{candidate.pool.name}")
        self._live = PoolLiveState()
        # Requests and prompt tokens sent since the last publication, which began the window.
        self._arrivals = 0
        self._prompt_tokens = 0
        self._window_start: float | None = None
        # (prefix-cache hits, lookups, the published hit rate) at the last state made
        self._hit_rate: tuple[int, int, float] = (0, 0, 0.0)

    def sent(self, prompt_tokens: int) -> None:
        """A request was sent to the pool (counted for the published arrival rates)."""
        self._arrivals += 1
        self._prompt_tokens += prompt_tokens

    def choose(self, seq: Seq | None = None) -> Replica:
        """Power of two choices on waiting + running; with ``prefix_aware``, the replica that
        holds ``seq``'s prefix key when it can run it (module docstring)."""
        replicas = self.replicas
        n = len(replicas)
        if n == 1:
            return replicas[0]
        draw = self._rng.random
        i = int(draw() * n)
        j = int(draw() * (n - 1))
        first, second = replicas[i], replicas[j + (j >= i)]
        # (their ``load``, inline)
        chosen = second if len(second.waiting) + second.running < len(first.waiting) + first.running else first
        if seq is None or not self.prefix_aware or seq.prefix_key is None:
            return chosen
        key = seq.prefix_key
        tree = self._tree
        warm = tree.get(key)
        if warm is not None and warm is not chosen and _has_room(warm, seq):
            chosen = warm
        tree[key] = chosen
        tree.move_to_end(key)
        if len(tree) > self._tree_size:
            tree.popitem(last=False)
        return chosen

    def drain(self) -> list[Seq]:
        """Take every waiting request (the region went down before they were admitted)."""
        taken: list[Seq] = list(self.held)
        self.held.clear()
        for replica in (*self.replicas, *self.stopping):
            taken.extend(replica.waiting)
            replica.waiting.clear()
        if taken:
            self.totals.waiting -= len(taken)
            self.totals.changed = True
        return taken

    @property
    def quiet(self) -> bool:
        """Whether every publication returns the state it last returned until a request is sent
        to the pool: nothing sent since the last one, that state published, its rates at 0, and
        no request on its replicas (so no step of theirs can change it)."""
        totals = self.totals
        live = self._live
        return (not self._arrivals and not totals.changed and not totals.waiting and not totals.running
                and self._window_start is not None and not live.arrival_rate and not live.prompt_tokens_rate)

    def published_quiet(self, at: float) -> None:
        """The pool's region published at ``at`` while the pool was ``quiet`` (a publication
        that would return the same state, which the data layer skips): the rate window starts
        there, as ``live(at)`` would have started it."""
        self._window_start = at

    def live(self, now: float) -> PoolLiveState:
        """What the pool publishes at ``now`` (the same object while nothing changed); the
        rates cover the interval since the previous call."""
        live = self._live
        if (not self._arrivals and not self.totals.changed and self._window_start is not None
                and not live.arrival_rate and not live.prompt_tokens_rate):
            # Idle since the last call, rates at 0: the averages stay 0, the state as it was.
            self._window_start = now
            return live
        window = None if self._window_start is None else now - self._window_start
        self._window_start = now
        arrival_rate, prompt_rate = self._live.arrival_rate, self._live.prompt_tokens_rate
        if window is not None and window > 0:
            weight = 1.0 - math.exp(-window / RATE_WINDOW_S)
            arrival_rate = round(arrival_rate + weight * (self._arrivals / window - arrival_rate), 3)
            prompt_rate = round(prompt_rate + weight * (self._prompt_tokens / window - prompt_rate), 1)
        self._arrivals = self._prompt_tokens = 0
        totals = self.totals
        live = self._live
        if totals.changed or (arrival_rate, prompt_rate) != (live.arrival_rate, live.prompt_tokens_rate):
            totals.changed = False
            warm = len(self.replicas) + len(self.stopping)
            capacity = warm * self.costs.kv_capacity_tokens
            hit_rate = self._hit_rate
            if hit_rate[0] != totals.hits or hit_rate[1] != totals.lookups:
                # (rounded again only when a lookup was made)
                hit_rate = self._hit_rate = (totals.hits, totals.lookups,
                                             round(totals.hits / totals.lookups, 2) if totals.lookups else 0.0)
            self._live = _pool_state(
                totals.waiting,
                totals.running,
                len(self.replicas),
                len(self.starting),
                # a pool at zero has no KV cache in use (vLLM reports none); a replica without
                # room for any KV is full
                round(totals.kv_held / capacity, 3) if capacity else (1.0 if warm else 0.0),
                hit_rate[2],
                arrival_rate,
                prompt_rate,
            )
        return self._live

    @property
    def busy_s(self) -> float:
        return self.totals.busy_s

    @property
    def step_energy_j(self) -> float:
        """Every step's energy on the pool's replicas so far [J]."""
        return sum(r.energy_j for r in self.every)

    @property
    def ongoing(self) -> int:
        """Requests on the pool: held for a replica, waiting and running on its replicas."""
        return self.totals.waiting + self.totals.running

    def hold(self, seq: Seq) -> None:
        """No replica is warm: ``seq`` waits for the first one ready."""
        self.held.append(seq)
        self.totals.waiting += 1
        self.totals.changed = True

    def mark(self, now: float) -> None:
        """Bring ``warm_s`` up to ``now`` (before the warm replicas change)."""
        self.warm_s += (len(self.replicas) + len(self.stopping)) * (now - self._warm_since)
        self._warm_since = now

    def scale_to(self, target: int, now: float, cold_start_s: float, cold_start_j: float) -> list[float]:
        """Start or retire replicas so that warm + starting = ``target``; returns the ready
        times of those started. A retired starting replica's cold-start energy is charged
        for the share of ``cold_start_s`` it ran."""
        have = len(self.replicas) + len(self.starting)
        started: list[float] = []
        if target != have:
            self.totals.changed = True  # the published replica counts change
        if target > have:
            for _ in range(target - have):
                replica = Replica(self.costs, self._on_done, self.totals, knee=self._knee)
                self.every.append(replica)
                self.starting.append((now + cold_start_s, replica))
                started.append(now + cold_start_s)
            self.cold_starts += target - have
            self.cold_start_j += (target - have) * cold_start_j
            return started
        excess = have - target
        while excess and self.starting:
            ready_at, _ = self.starting.pop()  # the newest first
            if cold_start_s > 0:
                self.cold_start_j -= cold_start_j * (ready_at - now) / cold_start_s
            excess -= 1
        if excess:
            self.mark(now)
            # the warm replicas with the fewest requests, the newest first among equals
            order = sorted(range(len(self.replicas)), key=lambda i: (self.replicas[i].load, -i))
            leaving = set(order[:excess])
            retired = [r for i, r in enumerate(self.replicas) if i in leaving]
            self.stopping.extend(retired)
            self.replicas = [r for i, r in enumerate(self.replicas) if i not in leaving]
            # prefix keys stop leading to a retired replica
            for key in [key for key, replica in self._tree.items() if replica in retired]:
                del self._tree[key]
            self.stop_drained(now)
        return started

    def ready(self, now: float) -> list[tuple[Replica, float]]:
        """Replicas whose cold start has ended by ``now`` take requests; the held requests go
        to them. Returns (replica, its next step boundary) for those that started a step."""
        come = [r for at, r in self.starting if at <= now]
        if not come:
            return []
        self.mark(now)
        self.starting = [(at, r) for at, r in self.starting if at > now]
        self.replicas.extend(come)
        self.totals.changed = True  # the published replica counts change
        steps: list[tuple[Replica, float]] = []
        held, self.held = self.held, []
        self.totals.waiting -= len(held)
        for seq in held:
            replica = self.choose(seq)
            then = replica.arrive(seq, now)
            if then is not None:
                steps.append((replica, then))
        return steps

    def stop_drained(self, now: float) -> None:
        """Retired replicas that hold no request stop drawing power at ``now``."""
        if any(not r.waiting and not r.running for r in self.stopping):
            self.mark(now)
            self.stopping = [r for r in self.stopping if r.waiting or r.running]


# A pool's published states are made by setting their slots (``scheduler.sim.slots``).
(_SET_QUEUE_DEPTH, _SET_RUNNING, _SET_KV_CACHE_USAGE, _SET_PREFIX_CACHE_HIT_RATE, _SET_GPU_POWER_W,
 _SET_MEASURED_J_PER_TOKEN, _SET_ARRIVAL_RATE, _SET_PROMPT_TOKENS_RATE, _SET_MODELS, _SET_REPLICAS,
 _SET_STARTING_REPLICAS, _SET_MODEL_REPLICAS) = slot_setters(PoolLiveState)


def _pool_state(queue_depth: int, running: int, replicas: int, starting_replicas: int, kv_cache_usage: float,
                prefix_cache_hit_rate: float, arrival_rate: float, prompt_tokens_rate: float) -> PoolLiveState:
    """``PoolLiveState`` with these fields, the others at their defaults (a simulated pool
    reports no power or model list)."""
    state = object.__new__(PoolLiveState)
    _SET_QUEUE_DEPTH(state, queue_depth)
    _SET_RUNNING(state, running)
    _SET_KV_CACHE_USAGE(state, kv_cache_usage)
    _SET_PREFIX_CACHE_HIT_RATE(state, prefix_cache_hit_rate)
    _SET_GPU_POWER_W(state, None)
    _SET_MEASURED_J_PER_TOKEN(state, None)
    _SET_ARRIVAL_RATE(state, arrival_rate)
    _SET_PROMPT_TOKENS_RATE(state, prompt_tokens_rate)
    _SET_MODELS(state, None)
    _SET_REPLICAS(state, replicas)
    _SET_STARTING_REPLICAS(state, starting_replicas)
    _SET_MODEL_REPLICAS(state, None)
    return state


def _has_room(replica: Replica, seq: Seq) -> bool:
    """Whether ``seq`` fits beside everything running and waiting on ``replica`` (sequence
    limit and KV reservations): it would not queue behind the replica's limits."""
    costs = replica.costs
    waiting = replica.waiting
    if replica.running + len(waiting) + 1 > costs.max_num_seqs:
        return False
    reserved = replica.kv_reserved + seq.reserve + sum(s.reserve for s in waiting)
    return reserved <= costs.kv_capacity_tokens
