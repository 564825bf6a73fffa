"""One vLLM replica, iteration by iteration, advanced many iterations at a time.

The replica schedules as vLLM V1 does, with one KV rule of its own:

- waiting requests form a FCFS queue; nothing overtakes its head;
- a request is admitted when the replica runs fewer than ``max_num_seqs`` sequences and the KV
  cache has room for its whole reservation, prompt + output tokens (reserved at admission, so
  no sequence is ever preempted); a request larger than the whole cache is admitted alone;
- at admission the replica's prefix cache (an LRU of prefix keys, ``PrefixCache``) is looked
  up: a hit skips the prefill of the cached part of the request's prefix (at least one prompt
  token is always computed);
- every step first gives each decoding sequence one token, then fills the rest of the token
  budget (``max_batched_tokens``) with prefill chunks, first the sequence left part-way
  (there is at most one), then newly admitted ones, FCFS;
- a sequence's first token comes at the end of the step that finishes its prefill; each
  later token takes one decode step, so a sequence of N output tokens decodes N - 1 steps
  and its last one is known when its prefill ends.

A step's features and cost (``StepCosts``, scheduler.energy.step):

    decode of a sequence in its k-th decode step:  1 token, c = prompt + k KV tokens read, c pairs
    prefill chunk of m tokens after s in the cache: m tokens, s KV tokens read, m s + m (m + 1) / 2 pairs
    time_s = t_step + t_token x tokens + t_kv x kv + t_pair x pairs   (energy_j alike)

Each sequence pays the energy of its own tokens, KV reads and pairs, plus ``e_step`` / (the
number of sequences in the step) for every step it is in; idle time draws ``idle_w``
(fleet idle energy, attributed to no request).

A KV knee (``KvKnee``, the simulator's truth model: ``scheduler.sim.truth``) makes the KV reads
of a long context dearer per token than the step model's linear term: a context of c tokens
reads

    kv(c) = c + (f - 1) x max(0, c - K)      KV-token equivalents (f: the knee's factor, K its tokens)

in place of c (a decode's KV tokens and a prefill chunk's, not the attention pairs). Without a
knee kv(c) = c.

Advancing in closed form. Between two events (an admission, a prefill step, a completion, a
sequence's context passing the knee) every step holds the same D decoding sequences and
nothing else; their summed context S grows by D per step and the summed excess over the knee
X = sum of (c - K) over the P sequences past it grows by P, so step i of such a run takes
a + 2 h i seconds, with a = t_step + t_token D + t_kv (S + (f - 1) X) + t_pair S and
h = (t_kv (D + (f - 1) P) + t_pair D) / 2, and k steps take

    T(k) = a k + h k (k - 1)           (energy E(k) alike, with the e_ coefficients)

The run ends at the step the first of its sequences finishes or passes the knee (both known
when its prefill ends), or earlier when a request arrives that can be admitted: it joins at
the first step that starts at or after its arrival, the smallest k with run start + T(k) >=
arrival - TIE_S (a quadratic, settled on the boundary times as the replica computes them).
The shared ``e_step`` goes through one running sum per replica, A += e_step / (sequences in
the step) (k e_step / D for a run): a sequence pays A(its last step) - A(before its first step).
Prefill steps are taken one at a time. ``scheduler.sim.reference`` runs the same rules step by
step; tests/unit/sim/test_replica.py checks that both agree.

Ties. An arrival joins the step that starts when it arrives: "when" to within ``TIE_S``
(1 us), so a step that starts at most 1 us before an arrival takes it. The fast replica and
the reference compute a boundary's time in different ways (run start + T(k), a running sum of
step times), and at an exact tie the two floats can land on either side of the arrival, by a
few ulps; 1 us is far above that (2.4e-7 s is one ulp of an epoch time in seconds) and far
below any step (a millisecond or more), so both take the same arrivals into the same steps.
``replay`` and the fleet simulator's event loop handle an arrival before every step boundary
up to ``TIE_S`` before it, the reference admits every arrival up to ``TIE_S`` after a step's
start; a request so admitted has an admission time up to 1 us before its arrival.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.energy.step import StepCosts

# Prefix-cache entries (distinct shared prefixes) each replica keeps before evicting the LRU one.
PREFIX_ENTRIES_PER_REPLICA = 8
# An arrival at most this long after a step's start joins that step (module doc, "Ties") [s].
TIE_S = 1e-6


@dataclass(frozen=True, slots=True)
class KvKnee:
    """KV reads of a context past ``tokens`` cost ``factor`` times a token's below it:
    kv(c) = c + (factor - 1) x max(0, c - tokens) KV-token equivalents (module doc)."""

    tokens: int
    factor: float

    def __post_init__(self) -> None:
        if self.tokens < 0 or not self.factor >= 1.0:
            raise ValueError(f"a KV knee needs tokens >= 0 and factor >= 1, got {self.tokens} and {self.factor}")

    def read(self, context: int) -> float:
        """kv(context)."""
        return context + (self.factor - 1.0) * max(0, context - self.tokens)

    def excess_sum(self, prompt: int, steps: int) -> int:
        """The sum over a sequence's decode steps k = 1 .. ``steps`` (context prompt + k) of
        max(0, prompt + k - tokens)."""
        first = max(1, self.tokens - prompt + 1)
        if first > steps:
            return 0
        return (steps - first + 1) * (prompt + first - self.tokens + prompt + steps - self.tokens) // 2


class Seq:
    """A request on a replica: what it asks for, and what the replica measured.

    ``prefix_tokens``: the prompt tokens it can reuse where its ``prefix_key`` is cached;
    ``leaves``: the tokens it leaves cached under the key (default ``prefix_tokens``; a chain's
    step leaves its whole context, prompt + output, for the next step)."""

    __slots__ = (
        "admitted", "arrived", "cached", "done", "energy_j", "first_token", "in_kv", "leaves", "output",
        "prefix_key", "prefix_tokens", "prompt", "share_mark",
    )

    def __init__(self, arrived: float, prompt: int, output: int, prefix_key: str | None = None,
                 prefix_tokens: int = 0, leaves: int | None = None) -> None:
        self.arrived = arrived
        self.prompt = prompt
        self.output = max(1, output)
        self.prefix_key = prefix_key
        self.prefix_tokens = prefix_tokens
        self.leaves = prefix_tokens if leaves is None else leaves
        # measured
        self.cached = 0
        self.in_kv = 0  # prompt tokens in the KV cache
        self.admitted = math.nan
        self.first_token = math.nan
        self.done = math.nan
        self.energy_j = 0.0  # own tokens, KV reads and pairs; the e_step share is added at the end
        self.share_mark = 0.0

    @property
    def reserve(self) -> int:
        return self.prompt + self.output


class PrefixCache:
    """An LRU of prefix keys, each with the tokens cached under it (the most any request left).

    ``lookup(key, tokens, leaves)``: a request that could reuse ``tokens`` of the key's prefix
    is served min(cached, tokens) from cache (0 on a miss: vLLM reuses the blocks it holds, no
    more), then the key holds max(cached, leaves) tokens and is the most recently used."""

    __slots__ = ("_entries", "_keys")

    def __init__(self, entries: int = PREFIX_ENTRIES_PER_REPLICA) -> None:
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._entries = entries

    def lookup(self, key: str | None, tokens: int, leaves: int | None = None) -> int:
        if key is None:
            return 0
        keys = self._keys
        stored = tokens if leaves is None else leaves
        cached = keys.get(key)
        if cached is not None:
            keys.move_to_end(key)
            if stored > cached:
                keys[key] = stored
            return min(cached, tokens)
        keys[key] = stored
        if len(keys) > self._entries:
            keys.popitem(last=False)
        return 0


class Totals:
    """Sums over a pool's replicas, kept as they change (what the pool publishes)."""

    __slots__ = ("busy_s", "changed", "hits", "kv_held", "lookups", "running", "waiting")

    def __init__(self) -> None:
        self.busy_s = 0.0  # the replicas' busy time, for the fleet's idle energy at each tick
        self.waiting = 0
        self.running = 0
        self.kv_held = 0
        # prefix-cache lookups and hits
        self.lookups = 0
        self.hits = 0
        self.changed = True


class Replica:
    """One replica (see the module doc). The caller keeps the events: ``arrive`` and
    ``boundary`` return the time of the replica's next step boundary when it changed (None:
    unchanged, or idle), and ``version`` tells a current event from a superseded one."""

    __slots__ = (
        "_a", "_chunks", "_decode_heap", "_ea", "_eh", "_extra", "_h", "_knee_heap", "_knee_tokens", "_run_k",
        "_run_t0", "_seq_no", "_step_decodes", "_step_past", "busy_s", "cache", "context_sum", "costs", "decoding",
        "energy_j", "excess", "knee", "kv_held", "kv_reserved", "next_t", "on_done", "past", "prefilling", "running",
        "share", "steps", "totals", "version", "waiting",
    )

    def __init__(self, costs: StepCosts, on_done: Callable[[Seq], None], totals: Totals | None = None,
                 prefix_entries: int = PREFIX_ENTRIES_PER_REPLICA, knee: KvKnee | None = None) -> None:
        if costs.max_batched_tokens < costs.max_num_seqs:
            raise ValueError(
                f"max_batched_tokens ({costs.max_batched_tokens}) must be at least max_num_seqs "
                f"({costs.max_num_seqs}), as vLLM requires"
            )
        self.costs = costs
        self.knee = knee
        # f - 1 and K of the knee (0: none, and the knee bookkeeping below stays at 0)
        self._extra = 0.0 if knee is None else knee.factor - 1.0
        self._knee_tokens = 0 if knee is None else knee.tokens
        self.on_done = on_done
        self.totals = totals or Totals()
        self.cache = PrefixCache(prefix_entries)
        self.waiting: deque[Seq] = deque()
        self.prefilling: Seq | None = None
        # (finish step, tie-break, sequence) of the decoding sequences
        self._decode_heap: list[tuple[int, int, Seq]] = []
        self._seq_no = 0
        # the prefill step in progress: its chunks (sequence, tokens) and its decodes
        self._chunks: list[tuple[Seq, int]] = []
        self._step_decodes = 0
        self._step_past = 0
        self.decoding = 0
        self.running = 0
        self.context_sum = 0  # KV tokens the decodes read in the next step
        # Past the knee: the decodes whose next step's context exceeds K, the sum of those
        # contexts' excess over K, and the steps after which another one's will (a heap).
        self.past = 0
        self.excess = 0
        self._knee_heap: list[int] = []
        self.kv_reserved = 0
        self.kv_held = 0
        self.steps = 0
        self.share = 0.0  # A: sum over steps of e_step / sequences in the step
        self.busy_s = 0.0
        self.energy_j = 0.0  # every step's energy (attributed or not)
        self.next_t = math.inf
        self.version = 0
        # the pure-decode run in progress (run_k > 0): start, planned steps, T(k) and E(k) terms
        self._run_t0 = 0.0
        self._run_k = 0
        self._a = self._h = self._ea = self._eh = 0.0

    @property
    def load(self) -> int:
        """Requests on the replica (waiting + running): what the router balances on."""
        return len(self.waiting) + self.running

    def can_admit(self, seq: Seq) -> bool:
        """Whether ``seq`` fits beside the running sequences (sequence count and KV reservation)."""
        return self.running < self.costs.max_num_seqs and (
            self.kv_reserved + seq.reserve <= self.costs.kv_capacity_tokens or self.running == 0
        )

    def arrive(self, seq: Seq, now: float) -> float | None:
        """``seq`` joins the waiting queue at ``now``."""
        was_empty = not self.waiting
        self.waiting.append(seq)
        totals = self.totals
        totals.waiting += 1
        totals.changed = True
        if self.next_t == math.inf:  # idle: a step starts now
            self.next_t = now
            self.version += 1
            return now
        if self._run_k == 0 or not was_empty or not self.can_admit(seq):
            return None  # a prefill step ends soon, or the queue's head is blocked
        # A pure-decode run: cut it at the first step that starts at or after ``now``.
        k = self._steps_before(now)
        if k >= self._run_k:
            return None
        self._run_k = k
        self.next_t = self._run_time(k)
        self.version += 1
        return self.next_t

    def _run_time(self, k: int) -> float:
        """When step k of the run in progress starts (its first step is step 0): run start + T(k)."""
        return self._run_t0 + self._a * k + self._h * k * (k - 1)

    def _steps_before(self, now: float) -> int:
        """The smallest k >= 0 whose step takes an arrival at ``now`` in the run in progress:
        step k starts at or after now - ``TIE_S`` (module doc, "Ties").

        The quadratic gives an estimate from now - run start; the answer is settled on the
        boundary times themselves, ``_run_time(k)`` (monotone in k), the very times the
        replica publishes, so that an arrival on a boundary joins the step that starts there
        and none joins a step that started more than ``TIE_S`` before it."""
        due = now - TIE_S
        x = due - self._run_t0
        if x <= 0.0:
            return 0
        a, h = self._a, self._h
        b = a - h
        k = math.ceil((2.0 * x / (b + math.sqrt(b * b + 4.0 * h * x))) if h > 0.0 else x / a)
        while k > 0 and self._run_time(k - 1) >= due:
            k -= 1
        while self._run_time(k) < due:
            k += 1
        return k

    def boundary(self, now: float) -> float | None:
        """The step (or run of steps) that ends at ``now`` ends: finish what it finished and
        start the next one. Returns when that one ends (None: the replica is idle)."""
        k = self._run_k
        if k:
            self._end_run(k)
        elif self._chunks:
            self._end_step(now)
        heap = self._decode_heap
        steps = self.steps
        while heap and heap[0][0] == steps:
            self._finish(heapq.heappop(heap)[2], now, decoded=True)
        knees = self._knee_heap
        while knees and knees[0] == steps:
            heapq.heappop(knees)
            self.past += 1  # its next step's context is K + 1
            self.excess += 1
        return self._start_step(now)

    def _end_run(self, k: int) -> None:
        d = self.decoding
        self.steps += k
        self.share += k * self.costs.e_step / d
        self.context_sum += d * k
        self.excess += self.past * k
        self.kv_held += d * k
        self.totals.kv_held += d * k
        self.totals.changed = True
        busy = self._a * k + self._h * k * (k - 1)
        self.busy_s += busy
        self.totals.busy_s += busy
        self.energy_j += self._ea * k + self._eh * k * (k - 1)
        self._run_k = 0

    def _end_step(self, now: float) -> None:
        """The effects of the prefill step that ends at ``now``: its decodes one token further,
        its chunks in the cache, the prefills it completed emit their first token."""
        c = self.costs
        self.steps += 1
        grown = self._step_decodes
        self.context_sum += grown
        self.excess += self._step_past
        kv_per_pair = c.e_kv + c.e_pair
        extra, knee_tokens = self._extra, self._knee_tokens
        for seq, m in self._chunks:
            s = seq.in_kv
            kv = s + extra * (s - knee_tokens) if extra and s > knee_tokens else s
            seq.energy_j += c.e_token * m + c.e_kv * kv + c.e_pair * (m * s + m * (m + 1) // 2)
            seq.in_kv = s + m
            grown += m
            if seq.in_kv < seq.prompt:
                self.prefilling = seq
                continue
            seq.first_token = now
            n = seq.output - 1
            if n == 0:
                self._finish(seq, now, decoded=False)
                continue
            # n decode steps reading prompt + 1, ..., prompt + n
            prompt = seq.prompt
            seq.energy_j += n * c.e_token + kv_per_pair * (n * prompt + n * (n + 1) // 2)
            self._seq_no += 1
            heapq.heappush(self._decode_heap, (self.steps + n, self._seq_no, seq))
            self.decoding += 1
            self.context_sum += prompt + 1
            if extra:
                assert self.knee is not None
                seq.energy_j += c.e_kv * extra * self.knee.excess_sum(prompt, n)
                if prompt + 1 > knee_tokens:
                    self.past += 1
                    self.excess += prompt + 1 - knee_tokens
                elif knee_tokens - prompt < n:  # its context passes K before its last step
                    heapq.heappush(self._knee_heap, self.steps + knee_tokens - prompt)
        self._chunks = []
        self.kv_held += grown
        self.totals.kv_held += grown
        self.totals.changed = True

    def _finish(self, seq: Seq, now: float, decoded: bool) -> None:
        seq.done = now
        seq.energy_j += self.share - seq.share_mark
        held = seq.prompt + seq.output - 1
        if decoded:
            self.decoding -= 1
            self.context_sum -= seq.prompt + seq.output
            over = seq.prompt + seq.output - self._knee_tokens
            if self._extra and over >= 2:  # past the knee (``_end_step`` put it there)
                self.past -= 1
                self.excess -= over
        self.running -= 1
        self.kv_reserved -= seq.prompt + seq.output  # its reserve
        self.kv_held -= held
        totals = self.totals
        totals.running -= 1
        totals.kv_held -= held
        totals.changed = True
        self.on_done(seq)

    def _start_step(self, now: float) -> float | None:
        c = self.costs
        d = self.decoding
        budget = c.max_batched_tokens - d
        tokens = d
        pairs = self.context_sum
        extra, knee_tokens = self._extra, self._knee_tokens
        kv = pairs + extra * self.excess if extra else pairs
        chunks: list[tuple[Seq, int]] = []
        seq = self.prefilling
        if seq is not None:
            self.prefilling = None
            s = seq.in_kv
            m = min(seq.prompt - s, budget)
            chunks.append((seq, m))
            tokens += m
            kv += s + extra * (s - knee_tokens) if extra and s > knee_tokens else s
            pairs += m * s + m * (m + 1) // 2
            budget -= m
        waiting = self.waiting
        max_num_seqs, kv_capacity = c.max_num_seqs, c.kv_capacity_tokens
        while budget > 0 and waiting:
            # ``can_admit(waiting[0])``, inline (three calls a request)
            head = waiting[0]
            if not (self.running < max_num_seqs and (
                    self.kv_reserved + head.prompt + head.output <= kv_capacity or self.running == 0)):
                break
            seq = waiting.popleft()
            seq.admitted = now
            seq.share_mark = self.share
            totals = self.totals
            cached = 0
            if seq.prefix_key is not None:
                totals.lookups += 1
                cached = self.cache.lookup(seq.prefix_key, seq.prefix_tokens, seq.leaves)
                if cached:
                    totals.hits += 1
                    cached = min(cached, seq.prompt - 1)
            seq.cached = seq.in_kv = cached
            self.running += 1
            self.kv_reserved += seq.prompt + seq.output  # its reserve
            self.kv_held += cached
            totals.waiting -= 1
            totals.running += 1
            totals.kv_held += cached
            totals.changed = True
            m = min(seq.prompt - cached, budget)
            chunks.append((seq, m))
            tokens += m
            kv += cached + extra * (cached - knee_tokens) if extra and cached > knee_tokens else cached
            pairs += m * cached + m * (m + 1) // 2
            budget -= m
        if not chunks:
            if d == 0:
                self.next_t = math.inf
                return None
            return self._start_run(now)
        duration = c.step_time(tokens, kv, pairs)
        self.busy_s += duration
        self.totals.busy_s += duration
        self.energy_j += c.step_energy(tokens, kv, pairs)
        self.share += c.e_step / (d + len(chunks))
        self._chunks = chunks
        self._step_decodes = d
        self._step_past = self.past
        self.next_t = now + duration
        return self.next_t

    def _start_run(self, now: float) -> float:
        """Decode-only steps from ``now`` until the first of the decodes finishes or passes the knee."""
        c = self.costs
        d = self.decoding
        s = self.context_sum
        k = self._decode_heap[0][0] - self.steps
        if self._extra:
            if self._knee_heap:
                k = min(k, self._knee_heap[0] - self.steps)
            # KV-token equivalents read in the run's first step, and their growth per step
            kv, kv_growth = s + self._extra * self.excess, d + self._extra * self.past
        else:
            kv, kv_growth = s, d
        self._a = c.t_step + c.t_token * d + c.t_kv * kv + c.t_pair * s
        self._h = (c.t_kv * kv_growth + c.t_pair * d) * 0.5
        self._ea = c.e_step + c.e_token * d + c.e_kv * kv + c.e_pair * s
        self._eh = (c.e_kv * kv_growth + c.e_pair * d) * 0.5
        self._run_t0 = now
        self._run_k = k
        self.next_t = self._run_time(k)
        return self.next_t


def replay(costs: StepCosts, seqs: list[Seq], prefix_entries: int = PREFIX_ENTRIES_PER_REPLICA,
           knee: KvKnee | None = None) -> Replica:
    """Run ``seqs`` on one replica, filling in what each measured, with the event rules of the
    fleet simulator: a boundary at the same time as an arrival (to within ``TIE_S``) comes
    after it."""
    replica = Replica(costs, lambda seq: None, prefix_entries=prefix_entries, knee=knee)
    events: list[tuple[float, int]] = []

    def until(t: float) -> None:
        while events and events[0][0] < t - TIE_S:
            at, version = heapq.heappop(events)
            if version == replica.version:
                then = replica.boundary(at)
                if then is not None:
                    heapq.heappush(events, (then, replica.version))

    for seq in sorted(seqs, key=lambda s: s.arrived):
        until(seq.arrived)
        then = replica.arrive(seq, seq.arrived)
        if then is not None:
            heapq.heappush(events, (then, replica.version))
    until(math.inf)
    return replica
