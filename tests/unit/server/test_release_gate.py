"""A deferred release runs under its tenant's limits, as a live Generate does
(scheduler.server.deferral_api.ReleaseGate): one of the tenant's stream slots on this router and one
token of its shared rate, the lowest its keys set; the settings' jurisdiction rule."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from scheduler import errors
from scheduler.server.auth import KeyRing, Principal, TenantRateLimiter, create_key
from scheduler.server.deferral_api import ReleaseGate
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.server.rate_limit import SharedRateLimiter
from scheduler.server.stream_slots import StreamSlots
from scheduler.state.memory_store import MemoryStore


@dataclass
class Deps:
    """The parts the gate reads (``scheduler.server.router_parts.TenantLimits``)."""

    keys: KeyRing | None
    slots: StreamSlots = field(default_factory=lambda: StreamSlots(100))
    limiter: SharedRateLimiter = field(default_factory=lambda: SharedRateLimiter(
        MemoryStore(clock=time.time), TenantRateLimiter(default_rps=1000.0, burst_s=1.0)))


async def test_a_release_takes_a_stream_slot_and_a_token_of_the_tenants_rate() -> None:
    ring = KeyRing.of([create_key("acme", max_concurrent_streams=5).entry,
                       create_key("acme", max_concurrent_streams=2, rate_limit_rps=3.0).entry,
                       create_key("globex").entry])
    deps = Deps(ring)
    gate = ReleaseGate(deps)  # type: ignore[arg-type]
    assert gate.principal("acme") == Principal("acme", admin=False, rate_limit_rps=3.0, max_concurrent_streams=2)
    assert await gate.enter("acme") and await gate.enter("acme")
    assert not await gate.enter("acme")  # its two streams are taken: the release waits
    assert deps.slots.held("acme") == 2
    assert await gate.enter("globex")  # another tenant's go on
    gate.leave("acme")
    assert await gate.enter("acme")  # a slot is free: the third token of its burst (3/s, a second's worth)
    gate.leave("acme")
    assert not await gate.enter("acme")  # a slot is free, but its rate is spent
    assert deps.slots.held("acme") == 1  # the slot taken for the refused release was given back


async def test_a_router_without_keys_applies_its_defaults() -> None:
    deps = Deps(None, slots=StreamSlots(1))
    gate = ReleaseGate(deps)  # type: ignore[arg-type]
    assert await gate.enter("local") and not await gate.enter("local")


@pytest.mark.parametrize(("jurisdictions", "refused"), [
    ((), False),  # may run anywhere: may be kept anywhere
    (("US",), False),  # not named: any store
    (("EU",), True),
    (("CH", "EU"), False),  # CH is kept here: it could run in CH
    (("DE", "EU"), True),
])
def test_the_stores_a_jurisdictions_deferred_requests_may_be_kept_in(jurisdictions: tuple[str, ...],
                                                                      refused: bool) -> None:
    settings = DeferralSettings(store_url="redis://user:secret@us-redis:6379/0",
                                stores={"EU": ("redis://eu-redis:6379/0",), "DE": ("redis://eu-redis:6379/0",),
                                        "CH": ("redis://us-redis:6379/0", "redis://ch-redis:6379/0")})
    refusal = settings.refusal(jurisdictions)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert isinstance(refusal, errors.StorageRefused) and refusal.jurisdictions == tuple(sorted(jurisdictions))
        assert "redis://us-redis:6379/0" in str(refusal) and "secret" not in str(refusal)
        assert "EU in redis://eu-redis:6379/0" in str(refusal)


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="max_held"):
        DeferralSettings(max_held=0)
    with pytest.raises(ValueError, match="result_ttl_s"):
        DeferralSettings(result_ttl_s=0.0)
