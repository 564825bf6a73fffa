"""API keys (salted hashes), the keys file, and the per-tenant token bucket."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scheduler import errors
from scheduler.config.loader import ConfigError
from scheduler.server.auth import KeyRing, Principal, TenantRateLimiter, create_key


def test_a_created_key_authenticates_and_is_not_stored() -> None:
    new = create_key("acme", admin=True, rate_limit_rps=5)
    ring = KeyRing.of([new.entry])
    assert ring.authenticate(f"Bearer {new.key}") == Principal("acme", True, new.entry.id, 5)
    assert ring.authenticate(f"bearer {new.key}").tenant == "acme"
    secret = new.key.split(".", 1)[1]
    assert secret not in new.entry_yaml() and new.entry.sha256 not in new.key


@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Basic abc", "Bearer sk-", "Bearer sk-unknown.secret", "Bearer nonsense",
])
def test_bad_authorization_is_unauthenticated(header: str | None) -> None:
    ring = KeyRing.of([create_key("acme").entry])
    with pytest.raises(errors.Unauthenticated):
        ring.authenticate(header)


def test_right_id_wrong_secret_is_unauthenticated() -> None:
    new = create_key("acme")
    with pytest.raises(errors.Unauthenticated, match="unknown API key"):
        KeyRing.of([new.entry]).authenticate(f"Bearer sk-{new.entry.id}.wrong")


def test_keys_file_round_trip_and_errors_name_the_field(tmp_path: Path) -> None:
    new = create_key("acme")
    good = tmp_path / "keys.yaml"
    good.write_text(yaml.safe_dump({"keys": [new.entry.model_dump(exclude_none=True)]}))
    assert KeyRing.load(good).authenticate(f"Bearer {new.key}").tenant == "acme"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"keys": [{**new.entry.model_dump(), "role": "root"}]}))
    with pytest.raises(ConfigError) as caught:
        KeyRing.load(bad)
    assert str(bad) in str(caught.value) and "keys[0].role" in str(caught.value) and "root" in str(caught.value)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_per_tenant() -> None:
    clock = Clock()
    limiter = TenantRateLimiter(default_rps=2.0, burst_s=1.0, clock=clock)
    acme, globex = Principal("acme", False), Principal("globex", False, rate_limit_rps=10.0)
    limiter.check(acme)
    limiter.check(acme)
    with pytest.raises(errors.RateLimited) as caught:
        limiter.check(acme)
    assert caught.value.retry_after_s == pytest.approx(0.5)
    for _ in range(10):
        limiter.check(globex)  # another tenant, its own rate
    clock.t += 0.5
    limiter.check(acme)
    with pytest.raises(errors.RateLimited):
        limiter.check(acme)
