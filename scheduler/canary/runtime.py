"""``CanaryRuntime``: a router's part in its policy's canary (docs/canary.md).

- On the request path, ``observe`` only adds a finished stream's ``Outcome`` to this router's
  counts of the current window (no I/O); a background writer adds them to the window's hash in
  the store every ``flush_interval_s`` (``window_add``: one atomic add per window, once per
  batch, the hash expiring with its window), so every router counts into the same windows.
  While the store is down the batches wait (bounded) and are written when it is back. A stream
  registered with ``begin`` that has no first token when its TTFT budget runs out is counted as
  a miss then, by the writer's sweep (every ``flush_interval_s``), not when it ends: a region
  that hangs is seen within the budget, not after the read timeout.
- With every snapshot refresh (every 0.5 s), ``refresh`` reads the canary's record (an admin's
  on/off and its epoch), the epoch's rollback marker and both arms' counts of the current and
  the previous window, and judges them (``scheduler.canary.stats.judge``). A crossed bound
  sets the rollback marker (``set_nx``: the first router to see it writes it, with its reason),
  appends the reason to the audit stream (once, whichever routers saw it) and logs it; the arm
  is off on this router at once and on every other at its next refresh (within 0.5 s). It
  stays off: a marker is per epoch and never expires to speak of, and only an admin's
  ``set_arm(enabled=True)`` starts another epoch (its windows start empty).
- ``attach`` puts what was read into each snapshot (``FleetSnapshot.canary``): the arm's
  snapshot while it is on, nothing of it while it is off or before the first read. So the
  decision reads the on/off state from its snapshot and stays a function of (request, snapshot).

Store keys: ``scheduler.state.keys.canary*``. Metrics: ``samples`` (read at scrape time).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import json
import logging
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.canary.assign import CANARY, CONTROL
from scheduler.canary.policy import arm_policy, replaced_limits
from scheduler.canary.stats import ArmFigures, Outcome, Verdict, describe, hash_field, judge
from scheduler.policy import Canary, Policy
from scheduler.state import keys
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import start_loop, stop_task
from scheduler.types import CanarySplit, FleetSnapshot

log = logging.getLogger(__name__)

ON, ROLLED_BACK, OFF, UNKNOWN = "on", "rolled-back", "off", "unknown"
# A rollback marker is kept this long: for as long as anyone will run this canary's epoch.
ROLLBACK_KEEP_S = 10 * 365 * 86400.0
# How long a written batch's marker is kept (far longer than any retry of it).
BATCH_ONCE_TTL_S = 3600.0
# As the receipts' audit writer (scheduler.server.audit): the same stream, bounded alike.
AUDIT_MAXLEN = 100_000
AUDIT_ONCE_TTL_S = 86_400.0
MAX_REASON_CHARS = 500

Sample = tuple[str, Mapping[str, str], float]


class NoCanary(Exception):
    """The router's policy has no canary section."""


@dataclass(frozen=True)
class CanaryRecord:
    """The store's record of a policy's canary (``keys.canary``): absent, on in epoch "0"."""

    epoch: str = "0"
    enabled: bool = True
    reason: str = ""
    updated_at: float = 0.0
    updated_by: str = ""

    def encode(self, arm: str) -> bytes:
        return json.dumps({"epoch": self.epoch, "enabled": self.enabled, "arm": arm, "reason": self.reason,
                           "updated_at": self.updated_at, "updated_by": self.updated_by}).encode()


def decode_record(raw: bytes | None) -> CanaryRecord:
    """ValueError when the record is malformed."""
    if raw is None:
        return CanaryRecord()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"canary record is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("enabled", True), bool) \
            or not isinstance(data.get("epoch", "0"), str):
        raise ValueError(f"canary record must be an object with a string epoch and a boolean enabled, got {data!r}")
    at = data.get("updated_at", 0.0)
    return CanaryRecord(epoch=data.get("epoch", "0"), enabled=data.get("enabled", True),
                        reason=str(data.get("reason", "")), updated_at=float(at) if isinstance(at, int | float) else 0.0,
                        updated_by=str(data.get("updated_by", "")))


def decode_rollback(raw: bytes | None) -> dict[str, Any] | None:
    """The rollback marker's payload; any marker at all means rolled back."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    return data if isinstance(data, dict) else {"reason": "rolled back (the marker's payload is unreadable)"}


@dataclass(frozen=True)
class WindowFigures:
    start: float
    length_s: float
    control: ArmFigures
    canary: ArmFigures

    def __add__(self, other: WindowFigures) -> WindowFigures:
        start = min(self.start, other.start)
        end = max(self.start + self.length_s, other.start + other.length_s)
        return WindowFigures(start, end - start, self.control + other.control, self.canary + other.canary)


@dataclass(frozen=True)
class CanaryView:
    """What this router last read of its policy's canary."""

    policy: str
    arm: str
    record: CanaryRecord
    # The rollback marker of (arm, record.epoch); None: not rolled back.
    rollback: Mapping[str, Any] | None
    # The current window, then the previous one.
    windows: tuple[WindowFigures, WindowFigures]
    read_at: float

    @property
    def judged(self) -> WindowFigures:
        return self.windows[0] + self.windows[1]


@dataclass(frozen=True)
class CanaryStatus:
    configured: bool
    policy: str
    arm: str = ""
    fraction: float = 0.0
    assign_by: str = ""
    enabled: bool = False
    state: str = UNKNOWN
    reason: str = ""
    epoch: str = ""
    updated_at: float = 0.0
    updated_by: str = ""
    judged: WindowFigures | None = None
    windows: tuple[WindowFigures, ...] = ()
    thresholds: tuple[str, ...] = ()
    read_at: float = 0.0


@dataclass(eq=False)
class OpenStream:
    """A stream ``CanaryRuntime.begin`` registered, until ``observe`` counts how it ended."""

    split: CanarySplit
    arm: str
    first_text: Callable[[], bool]
    done: bool = False
    # Counted as a TTFT miss when its budget ran out without a first token.
    missed: bool = False


@dataclass
class CanaryRuntime:
    store: StateStore
    # Every policy by name: the arms are looked up here (replace with ``use_policies`` when the
    # policies are reloaded).
    policies: Mapping[str, Policy] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    host_id: str = field(default_factory=socket.gethostname)
    # How long observations gather before they are written (one write per window per batch).
    flush_interval_s: float = 0.1
    retry_s: float = 1.0
    # Batches kept while the store is down; beyond, the oldest are dropped (and counted).
    max_batches: int = 10_000
    # Rollbacks this router decided (it set the marker first).
    rollbacks: int = field(default=0, init=False)
    dropped_batches: int = field(default=0, init=False)
    _view: CanaryView | None = field(default=None, init=False, repr=False)
    # Rollbacks decided here whose marker is not in the store yet: (policy, arm, epoch) -> payload.
    _local_off: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _arms: dict[tuple[int, int], tuple[Policy, Policy, Policy]] = field(
        default_factory=dict, init=False, repr=False)
    _missing_arms: set[str] = field(default_factory=set, init=False, repr=False)
    # window key -> (its TTL, field -> amount) not yet handed to the writer
    _pending: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict, init=False, repr=False)
    # (window key, amounts, once key, TTL) waiting to be written, oldest first
    _batches: deque[tuple[str, dict[str, float], str, float]] = field(default_factory=deque, init=False, repr=False)
    _observed: Counter[tuple[str, str, str]] = field(default_factory=Counter, init=False, repr=False)
    _writer_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12], init=False, repr=False)
    _seq: int = field(default=0, init=False, repr=False)
    _last_error: str = field(default="", init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    monotonic: Callable[[], float] = time.monotonic
    # (TTFT deadline, sequence, stream) of the streams ``begin`` registered, soonest first.
    _open: list[tuple[float, int, OpenStream]] = field(default_factory=list, init=False, repr=False)
    _open_live: int = field(default=0, init=False, repr=False)

    # --- the policies ----------------------------------------------------------------------

    def use_policies(self, policies: Mapping[str, Policy]) -> None:
        """The policies the arms are looked up in (a config reload passes the new ones)."""
        self.policies = policies
        self._arms.clear()
        self._missing_arms.clear()

    def arm_for(self, control: Policy) -> Policy | None:
        """The policy ``control``'s canary arm decides under (scheduler.canary.policy); None when
        the policy has no canary or its arm is not among ``policies``."""
        canary = control.canary
        if canary is None:
            return None
        arm = self.policies.get(canary.arm)
        if arm is None:
            if canary.arm not in self._missing_arms:
                self._missing_arms.add(canary.arm)
                log.error("canary: policy %r names the arm %r, which is not a loaded policy: the arm stays off",
                          control.name, canary.arm)
            return None
        key = (id(control), id(arm))
        memo = self._arms.get(key)
        if memo is None or memo[0] is not control or memo[1] is not arm:
            replaced = replaced_limits(control, arm)
            if replaced:
                log.info("canary: the arm %r decides under %r's hard limits, not its own: %s", arm.name,
                         control.name, ", ".join(replaced))
            memo = (control, arm, arm_policy(control, arm))
            if len(self._arms) >= 8:
                self._arms.clear()
            self._arms[key] = memo
        return memo[2]

    # --- the snapshot ----------------------------------------------------------------------

    def _view_of(self, policy: Policy) -> CanaryView | None:
        view = self._view
        canary = policy.canary
        if view is None or canary is None or view.policy != policy.name or view.arm != canary.arm:
            return None
        return view

    def state_of(self, view: CanaryView | None) -> str:
        if view is None:
            return UNKNOWN
        if view.rollback is not None or (view.policy, view.arm, view.record.epoch) in self._local_off:
            return ROLLED_BACK
        return ON if view.record.enabled else OFF

    def attach(self, snapshot: FleetSnapshot) -> FleetSnapshot:
        """``snapshot`` with its policy's canary as last read (unchanged without a canary)."""
        policy = snapshot.policy
        canary = policy.canary
        if canary is None:
            return snapshot
        view = self._view_of(policy)
        arm = self.arm_for(policy)
        enabled = arm is not None and self.state_of(view) == ON
        split = CanarySplit(control=policy.name, arm=canary.arm, fraction=canary.fraction,
                            assign_by=canary.assign_by, enabled=enabled,
                            epoch=view.record.epoch if view is not None else "0", window_s=canary.rollback.window)
        arm_snapshot = None
        if enabled and arm is not None:
            # Its own live_key: the plugin columns the framework keeps per inputs are the arm's.
            arm_snapshot = snapshot.copy_with(policy=arm, live_key=object(), canary=split, canary_arm=CANARY)
        return snapshot.copy_with(canary=dataclasses.replace(split, snapshot=arm_snapshot), canary_arm=CONTROL)

    # --- the request path --------------------------------------------------------------------

    def begin(self, snapshot: FleetSnapshot, ttft_deadline: float, first_text: Callable[[], bool]) -> OpenStream | None:
        """A stream decided on ``snapshot`` starts: without a first token (``first_text()``) by
        ``ttft_deadline`` (``monotonic``), it counts as a TTFT miss then. None: no canary."""
        split, arm = snapshot.canary, snapshot.canary_arm
        if split is None or arm not in (CONTROL, CANARY):
            return None
        stream = OpenStream(split, arm, first_text)
        self._seq += 1
        heapq.heappush(self._open, (ttft_deadline, self._seq, stream))
        self._open_live += 1
        self._wake.set()
        return stream

    def observe(self, snapshot: FleetSnapshot, outcome: Outcome, opened: OpenStream | None = None) -> None:
        """Count one finished stream decided on ``snapshot`` (no I/O); ``opened``: what ``begin``
        gave for it."""
        split, arm = snapshot.canary, snapshot.canary_arm
        if split is None or arm not in (CONTROL, CANARY):
            return
        if opened is not None and not opened.done:
            opened.done = True
            self._open_live -= 1
            if opened.missed:  # its miss was counted when its budget ran out
                outcome = dataclasses.replace(outcome, ttft_ok=None)
            if len(self._open) > 1024 and len(self._open) > 2 * self._open_live:
                self._open = [entry for entry in self._open if not entry[2].done]
                heapq.heapify(self._open)
        self._add(split, arm, outcome.amounts())
        self._observed[(split.control, split.arm, arm)] += 1
        self._wake.set()

    def _add(self, split: CanarySplit, arm: str, amounts: Mapping[str, float]) -> None:
        index = int(self.clock() // split.window_s)
        key = keys.canary_window(split.control, split.arm, split.epoch, split.window_s, index)
        entry = self._pending.get(key)
        if entry is None:
            entry = self._pending[key] = (3 * split.window_s + 60.0, {})
        table = entry[1]
        for name, amount in amounts.items():
            name = hash_field(arm, name)
            table[name] = table.get(name, 0.0) + amount

    def sweep(self) -> int:
        """Count the streams past their TTFT deadline without a first token as misses; how many."""
        now, missed = self.monotonic(), 0
        while self._open and self._open[0][0] <= now:
            _, _, stream = heapq.heappop(self._open)
            if stream.done:
                continue
            if not stream.first_text():
                stream.missed = True
                missed += 1
                self._add(stream.split, stream.arm, {"ttft_n": 1.0, "ttft_ok": 0.0})
        return missed

    # --- the writer ------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Batches not in the store yet."""
        return len(self._pending) + len(self._batches)

    async def flush(self) -> None:
        """Write what was observed; on ``StateUnavailable`` the rest stays queued (re-raised)."""
        if self._pending:
            for key, (ttl_s, amounts) in self._pending.items():
                self._seq += 1
                self._batches.append((key, amounts, keys.canary_once(f"{self._writer_id}:{self._seq}"), ttl_s))
            self._pending = {}
            while len(self._batches) > self.max_batches:
                self._batches.popleft()
                self.dropped_batches += 1
        while self._batches:
            key, amounts, once_key, ttl_s = self._batches[0]
            await self.store.window_add(key, amounts, ttl_s, once_key, BATCH_ONCE_TTL_S)
            self._batches.popleft()

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            # Gather what arrives meanwhile into the same batch.
            await asyncio.sleep(self.flush_interval_s)
            self._wake.clear()
            if self._open:
                self.sweep()
                self._wake.set()  # swept again next round while streams are open
            try:
                await self.flush()
            except StateUnavailable as exc:
                log.warning("canary: store unavailable, %d batches of counts queued: %s", len(self._batches), exc)
                await asyncio.sleep(self.retry_s)
                self._wake.set()
            except Exception:
                log.exception("canary: writing counts failed, %d batches queued; retrying", len(self._batches))
                await asyncio.sleep(self.retry_s)
                self._wake.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = start_loop(self._write_loop, "canary-writer")

    async def stop(self, flush_timeout_s: float = 2.0) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        with contextlib.suppress(StateUnavailable, TimeoutError):
            async with asyncio.timeout(flush_timeout_s):
                await self.flush()
        if self.pending:
            log.warning("canary: %d batches of counts not written at shutdown", self.pending)

    # --- the refresher's read ----------------------------------------------------------------

    async def refresh(self, policy: Policy) -> None:
        """Read the policy's canary from the store and judge its windows (the refresher's loop,
        every 0.5 s). The store down: the last reading stays (the arm as it was)."""
        canary = policy.canary
        if canary is None:
            self._view = None
            return
        async with self._lock:
            before = self.state_of(self._view_of(policy))
            try:
                view = await self._confirm_local_rollbacks(await self._read(policy, canary))
            except StateUnavailable as exc:
                if self._last_error != str(exc):
                    log.warning("canary: store unavailable, keeping the last reading of %r's canary: %s",
                                policy.name, exc)
                self._last_error = str(exc)
                return
            if self._last_error:
                self._last_error = ""
            self._view = view
            after = self.state_of(view)
            if after == ON and self.arm_for(policy) is not None:
                verdict = judge(canary.rollback, view.judged.control, view.judged.canary)
                if verdict is not None:
                    await self._roll_back(policy, canary, view, verdict)
                    after = self.state_of(self._view)
            self._log_change(policy, canary, before, after)

    async def _read(self, policy: Policy, canary: Canary) -> CanaryView:
        known = self._view_of(policy)
        epoch = known.record.epoch if known is not None else "0"
        record_key = keys.canary(policy.name)
        raw_record, raw_marker = await self.store.mget(
            [record_key, keys.canary_rollback(policy.name, canary.arm, epoch)])
        try:
            record = decode_record(raw_record)
        except ValueError as exc:
            log.warning("canary: ignoring the malformed record %s (the arm stays as it was): %s", record_key, exc)
            record = known.record if known is not None else CanaryRecord(enabled=False, reason=str(exc))
        if record.epoch != epoch:
            raw_marker = await self.store.get(keys.canary_rollback(policy.name, canary.arm, record.epoch))
        now = self.clock()
        length = canary.rollback.window
        index = int(now // length)
        windows = []
        for i in (index, index - 1):
            table = await self.store.hgetall(keys.canary_window(policy.name, canary.arm, record.epoch, length, i))
            windows.append(WindowFigures(i * length, length, ArmFigures.from_hash(table, CONTROL),
                                         ArmFigures.from_hash(table, CANARY)))
        return CanaryView(policy.name, canary.arm, record, decode_rollback(raw_marker), (windows[0], windows[1]), now)

    async def _roll_back(self, policy: Policy, canary: Canary, view: CanaryView, verdict: Verdict) -> None:
        """Turn the arm off: here at once, everywhere through the marker."""
        judged = view.judged
        payload = {
            "policy": policy.name, "arm": canary.arm, "epoch": view.record.epoch, "reason": verdict.reason,
            "metrics": list(verdict.metrics), "at": self.clock(), "by": f"router@{self.host_id}",
            "control": judged.control.summary(), "canary": judged.canary.summary(),
        }
        self._local_off[(policy.name, canary.arm, view.record.epoch)] = payload
        log.warning("canary: rolling back the arm %r of policy %r: %s", canary.arm, policy.name, verdict.reason)
        with contextlib.suppress(StateUnavailable):
            # Store down: the arm is off here meanwhile, and the next refresh writes it.
            self._view = await self._confirm_local_rollbacks(view)

    async def _confirm_local_rollbacks(self, view: CanaryView) -> CanaryView:
        """Write the markers of the rollbacks decided here for ``view``'s canary (the first
        writer's reason stays) and their audit entry (once, whoever writes it); ``view`` with
        the marker of its epoch."""
        for key, payload in list(self._local_off.items()):
            policy, arm, epoch = key
            if (policy, arm) != (view.policy, view.arm):
                continue
            marker = keys.canary_rollback(policy, arm, epoch)
            won = await self.store.set_nx(marker, json.dumps(payload).encode(), ROLLBACK_KEEP_S)
            stored = payload if won else (decode_rollback(await self.store.get(marker)) or payload)
            if won:
                self.rollbacks += 1
            await self.store.xadd_once(keys.AUDIT, rollback_audit_fields(stored), AUDIT_MAXLEN,
                                       keys.audit_once(f"canary-rollback:{policy}:{arm}:{epoch}"), AUDIT_ONCE_TTL_S)
            del self._local_off[key]
            if view.record.epoch == epoch and view.rollback is None:
                view = dataclasses.replace(view, rollback=stored)
        return view

    def _log_change(self, policy: Policy, canary: Canary, before: str, after: str) -> None:
        if before == after:
            return
        view = self._view
        if after == ON:
            log.warning("canary: the arm %r of policy %r is on (%.0f %% of the %s keys; epoch %s)", canary.arm,
                        policy.name, canary.fraction * 100, canary.assign_by, view.record.epoch if view else "?")
        elif after == ROLLED_BACK and view is not None and view.rollback is not None:
            log.warning("canary: the arm %r of policy %r is off on this router: rolled back by %s: %s", canary.arm,
                        policy.name, view.rollback.get("by", "?"), view.rollback.get("reason", ""))
        elif after == OFF and view is not None:
            log.warning("canary: the arm %r of policy %r is off on this router: switched off by %s (%s)", canary.arm,
                        policy.name, view.record.updated_by or "?", view.record.reason or "no reason given")

    # --- the admin ---------------------------------------------------------------------------

    async def set_arm(self, policy: Policy, enabled: bool, reason: str, by: str) -> CanaryRecord:
        """An admin's on (a new epoch: the windows start empty, a rollback is lifted) or off,
        for every router at its next refresh (this one's included: refresh it to apply it at
        once). ``StateUnavailable``: nothing changed."""
        canary = policy.canary
        if canary is None:
            raise NoCanary(f"policy {policy.name!r} has no canary section")
        known = self._view_of(policy)
        epoch = uuid.uuid4().hex[:12] if enabled else (known.record.epoch if known is not None else "0")
        record = CanaryRecord(epoch=epoch, enabled=enabled, reason=reason, updated_at=self.clock(), updated_by=by)
        await self.store.set(keys.canary(policy.name), record.encode(canary.arm))
        if enabled:
            for key in [key for key in self._local_off if key[:2] == (policy.name, canary.arm)]:
                del self._local_off[key]
        with contextlib.suppress(StateUnavailable):
            await self.store.xadd_once(keys.AUDIT, {
                "event": "canary-enable" if enabled else "canary-disable", "policy": policy.name, "arm": canary.arm,
                "epoch": epoch, "reason": reason, "by": by, "at": repr(record.updated_at)}, AUDIT_MAXLEN,
                keys.audit_once(f"canary-set:{policy.name}:{epoch}:{record.updated_at!r}"), AUDIT_ONCE_TTL_S)
        log.warning("canary: the arm %r of policy %r switched %s by %s (%s)", canary.arm, policy.name,
                    "ON (epoch " + epoch + ")" if enabled else "OFF", by, reason or "no reason given")
        return record

    def status(self, policy: Policy) -> CanaryStatus:
        canary = policy.canary
        if canary is None:
            return CanaryStatus(configured=False, policy=policy.name)
        view = self._view_of(policy)
        state = self.state_of(view)
        reason = ""
        if view is not None:
            local = self._local_off.get((view.policy, view.arm, view.record.epoch))
            if state == ROLLED_BACK:
                reason = str((view.rollback or local or {}).get("reason", ""))
            elif state == OFF:
                reason = view.record.reason
        else:
            reason = "the canary's record has not been read from the store yet"
        if self.arm_for(policy) is None:
            reason = f"the arm {canary.arm!r} is not a loaded policy: the control decides every request"
        updated_at, updated_by = (view.record.updated_at, view.record.updated_by) if view is not None else (0.0, "")
        if view is not None and view.rollback is not None:
            at = view.rollback.get("at")
            if isinstance(at, int | float) and at > updated_at:
                updated_at, updated_by = float(at), str(view.rollback.get("by", ""))
        return CanaryStatus(
            configured=True, policy=policy.name, arm=canary.arm, fraction=canary.fraction,
            assign_by=canary.assign_by, enabled=state == ON and self.arm_for(policy) is not None, state=state,
            reason=reason, epoch=view.record.epoch if view is not None else "", updated_at=updated_at,
            updated_by=updated_by, judged=view.judged if view is not None else None,
            windows=view.windows if view is not None else (), thresholds=tuple(describe(canary.rollback)),
            read_at=view.read_at if view is not None else 0.0,
        )

    # --- metrics -----------------------------------------------------------------------------

    def samples(self) -> Iterable[Sample]:
        view = self._view
        out: list[Sample] = [("scheduler_canary_pending_batches", {}, float(self.pending)),
                             ("scheduler_canary_dropped_batches_total", {}, float(self.dropped_batches))]
        if view is None:
            return out
        labels = {"policy": view.policy, "candidate": view.arm}
        state = self.state_of(view)
        out += [("scheduler_canary_enabled", labels, float(state == ON)),
                ("scheduler_canary_rolled_back", labels, float(state == ROLLED_BACK)),
                ("scheduler_canary_rollbacks_total", labels, float(self.rollbacks))]
        if view.rollback is not None:
            metrics = view.rollback.get("metrics")
            crossed = ",".join(str(m) for m in metrics) if isinstance(metrics, list) else ""
            out.append(("scheduler_canary_rollback_info", {**labels, "epoch": view.record.epoch, "metrics": crossed},
                        1.0))
        judged = view.judged
        for arm, figures in ((CONTROL, judged.control), (CANARY, judged.canary)):
            arm_labels = {**labels, "arm": arm}
            out.append(("scheduler_canary_window_requests", arm_labels, figures.requests))
            for name, value in figures.summary().items():
                if name != "requests" and value is not None:
                    out.append((f"scheduler_canary_{name}", arm_labels, value))
            out.append(("scheduler_canary_observed_total", arm_labels,
                        float(self._observed[(view.policy, view.arm, arm)])))
        return out


def rollback_audit_fields(payload: Mapping[str, Any]) -> dict[str, str]:
    """The audit stream's entry for a rollback (beside the receipts' entries: ``event`` says so)."""
    return {
        "event": "canary-rollback",
        "policy": str(payload.get("policy", "")),
        "arm": str(payload.get("arm", "")),
        "epoch": str(payload.get("epoch", "")),
        "reason": str(payload.get("reason", ""))[:2000],
        "metrics": ",".join(str(m) for m in payload.get("metrics", []) or []),
        "by": str(payload.get("by", "")),
        "at": repr(payload.get("at", 0.0)),
        "figures": json.dumps({"control": payload.get("control"), "canary": payload.get("canary")}),
    }
