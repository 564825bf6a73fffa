"""The replica of ``scheduler.sim.replica``, one step at a time: slow, and plainly the rules.

Each iteration: requests that arrived by the step's start (to within ``TIE_S``, the replica's
tie rule) join the waiting queue; every
running sequence whose prompt is in the cache decodes one token; the rest of the token budget
goes to running prefills in admission order, then to waiting requests admitted FCFS while
one fits (fewer than ``max_num_seqs`` running, prompt + output within the KV cache, or the
replica empty); the step's time and energy are summed from each sequence's own tokens, KV
reads and attention pairs (module doc of ``scheduler.sim.replica``; with a ``KvKnee``, a
context c reads kv(c) KV tokens), each sequence paying its own terms plus e_step / (sequences
in the step). Used by the tests only, as the standard
the fast replica must meet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from scheduler.energy.step import StepCosts
from scheduler.sim.replica import PREFIX_ENTRIES_PER_REPLICA, TIE_S, KvKnee, PrefixCache, Seq


def reference_replay(costs: StepCosts, seqs: Sequence[Seq], prefix_entries: int = PREFIX_ENTRIES_PER_REPLICA,
                     knee: KvKnee | None = None) -> float:
    """Run ``seqs`` (in arrival order) on one replica, filling in what each measured; returns
    the replica's busy time [s]."""
    read = KvKnee(0, 1.0).read if knee is None else knee.read
    cache = PrefixCache(prefix_entries)
    pending = deque(sorted(seqs, key=lambda s: s.arrived))
    waiting: deque[Seq] = deque()
    running: list[Seq] = []
    decoded: dict[int, int] = {}  # id(seq) -> decode steps done
    t = 0.0
    busy = 0.0
    while pending or waiting or running:
        if not waiting and not running and pending[0].arrived > t + TIE_S:
            t = pending[0].arrived  # idle until the next arrival
        while pending and pending[0].arrived <= t + TIE_S:
            waiting.append(pending.popleft())
        decodes = [s for s in running if s.in_kv == s.prompt]
        budget = costs.max_batched_tokens - len(decodes)
        chunks: list[tuple[Seq, int]] = []
        for s in running:
            if s.in_kv < s.prompt and budget > 0:
                m = min(s.prompt - s.in_kv, budget)
                chunks.append((s, m))
                budget -= m
        while budget > 0 and waiting:
            head = waiting[0]
            reserved = sum(s.prompt + s.output for s in running)
            fits = reserved + head.prompt + head.output <= costs.kv_capacity_tokens or not running
            if len(running) >= costs.max_num_seqs or not fits:
                break
            waiting.popleft()
            head.admitted = t
            head.cached = head.in_kv = min(cache.lookup(head.prefix_key, head.prefix_tokens, head.leaves), head.prompt - 1)
            running.append(head)
            decoded[id(head)] = 0
            m = min(head.prompt - head.in_kv, budget)
            chunks.append((head, m))
            budget -= m
        members = len(decodes) + len(chunks)
        tokens = pairs = 0
        kv = 0.0
        for s in decodes:
            context = s.prompt + decoded[id(s)] + 1
            tokens, kv, pairs = tokens + 1, kv + read(context), pairs + context
            s.energy_j += costs.e_step / members + costs.e_token + costs.e_kv * read(context) + costs.e_pair * context
        for s, m in chunks:
            chunk_pairs = m * s.in_kv + m * (m + 1) // 2
            tokens, kv, pairs = tokens + m, kv + read(s.in_kv), pairs + chunk_pairs
            s.energy_j += (costs.e_step / members + costs.e_token * m + costs.e_kv * read(s.in_kv)
                           + costs.e_pair * chunk_pairs)
        duration = costs.step_time(tokens, kv, pairs)
        t += duration
        busy += duration
        for s in decodes:
            decoded[id(s)] += 1
            if decoded[id(s)] == s.output - 1:
                s.done = t
                running.remove(s)
        for s, m in chunks:
            s.in_kv += m
            if s.in_kv == s.prompt:
                s.first_token = t
                if s.output == 1:
                    s.done = t
                    running.remove(s)
    return busy
