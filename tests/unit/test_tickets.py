"""Dispatch tickets: what a region accepts and what it refuses, with which status and reason."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import tickets
from scheduler.tickets import (
    MAX_TICKET_TTL_S,
    RegionKeys,
    Ticket,
    TicketKeyRing,
    TicketKeysError,
    TicketRejected,
    body_digest,
)
from scheduler.types import FleetSnapshot

NOW = 1_780_000_000.0
RING = TicketKeyRing({name: RegionKeys.generate(name, kid=f"{name}-k1") for name in ("eu-north", "us-east")})
BODY = {"model": "llama-3.1-8b", "prompt": "Hello there", "max_tokens": 64}


def ticket(**overrides: object) -> Ticket:
    digest, _ = body_digest(BODY) or ("", 0)
    fields: dict[str, object] = dict(
        decision_id="d1", request_id="r1", tenant="acme", region="eu-north", pool="h200-long",
        model="llama-3.1-8b", max_tokens=64, prompt_tokens_max=8, body_sha256=digest, expires_at=NOW + 30,
    )
    fields.update(overrides)
    return Ticket(**fields)  # type: ignore[arg-type]


def admit(token: str, body: dict[str, object] = BODY, *, region: str = "eu-north", now: float = NOW,
          pool: str | None = None, endpoint: str = tickets.COMPLETIONS, skew_s: float = tickets.CLOCK_SKEW_S) -> Ticket:
    """The gateway's checks, in its order."""
    engine = tickets.engine_body(body)
    checked = Ticket.verify(RING.of(region), token)
    tickets.check(checked, region=region, now=now, body=engine, pool=pool, endpoint=endpoint, clock_skew_s=skew_s)
    return checked


def test_a_signed_ticket_round_trips() -> None:
    issued = ticket()
    assert admit(issued.sign(RING.of("eu-north"))) == issued


def _tamper_claims(token: str, **changes: object) -> str:
    """Re-encode the claims with ``changes`` but keep the original signature."""
    import base64
    import json

    version, kid, body, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims.update(changes)
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return ".".join((version, kid, forged, mac))


REFUSED = [
    ("no such format", lambda: "not-a-ticket", {}, 401, "malformed ticket"),
    ("tampered: another pool in the claims", lambda: _tamper_claims(ticket().sign(RING.of("eu-north")), pool="a100-batch"),
     {}, 401, "bad ticket signature"),
    ("tampered: higher max_tokens in the claims", lambda: _tamper_claims(ticket().sign(RING.of("eu-north")),
                                                                        max_tokens=100000), {}, 401, "bad ticket signature"),
    ("signed with another region's key", lambda: dataclasses.replace(ticket(), region="us-east").sign(RING.of("us-east")),
     {}, 401, "unknown key id"),
    ("expired", lambda: ticket(expires_at=NOW - 6).sign(RING.of("eu-north")), {}, 401, "ticket expired"),
    ("expiry beyond the 30 s limit", lambda: ticket(expires_at=NOW + 3600).sign(RING.of("eu-north")), {}, 401,
     "more than 30 s"),
    ("request asks for another pool", lambda: ticket().sign(RING.of("eu-north")), {"pool": "a100-batch"}, 403,
     "ticket is for pool h200-long"),
    ("higher max_tokens in the request", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "max_tokens": 65}}, 403, "exceeds the ticket's 64"),
    ("the chat alias asks for more tokens", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "max_completion_tokens": 4000}}, 403, "max_completion_tokens 4000 exceeds the ticket's 64"),
    ("n completions for one ticket", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "n": 100}}, 403, "n=100: a ticket covers one completion"),
    ("best_of for one ticket", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "best_of": 8}}, 403, "'best_of' not allowed"),
    ("another model in the request", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "model": "llama-3.1-70b"}}, 403, "ticket is for model llama-3.1-8b"),
    ("another prompt in the request", lambda: ticket().sign(RING.of("eu-north")),
     {"body": {**BODY, "prompt": "Hello there!"}}, 403, "not the one the ticket was issued for"),
    ("a prompt far beyond the token bound", lambda: ticket(
        body_sha256=body_digest({"prompt": "x" * 600_000})[0],  # type: ignore[index]
        prompt_tokens_max=1).sign(RING.of("eu-north")),
     {"body": {**BODY, "prompt": "x" * 600_000}}, 403, "at least 4,688 tokens exceeds the ticket's bound of 1 tokens"),
]


@pytest.mark.parametrize(("name", "make", "options", "status", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_region_refuses(name: str, make: object, options: dict[str, object], status: int, reason: str) -> None:
    token = make()  # type: ignore[operator]
    with pytest.raises(TicketRejected) as refused:
        admit(token, options.get("body", BODY), pool=options.get("pool"))  # type: ignore[arg-type]
    assert refused.value.status == status
    assert reason in refused.value.reason


def test_a_ticket_for_another_region_is_refused_there() -> None:
    token = dataclasses.replace(ticket(), region="us-east").sign(RING.of("us-east"))
    # us-east's gateway verifies it...
    assert admit(token, region="us-east").region == "us-east"
    # ...but a ticket eu-north signed for itself is no good in us-east, and vice versa.
    with pytest.raises(TicketRejected) as refused:
        admit(ticket().sign(RING.of("eu-north")), region="us-east")
    assert refused.value.status == 401


def test_a_receipt_signature_never_passes_for_a_ticket() -> None:
    receipt_token = tickets.sign(RING.of("eu-north"), "receipt", dataclasses.asdict(ticket()))
    with pytest.raises(TicketRejected, match="bad ticket signature"):
        Ticket.verify(RING.of("eu-north"), receipt_token)


def test_rotation_keeps_the_old_key_valid_until_it_is_removed() -> None:
    old = RING.of("eu-north")
    new = RegionKeys.generate("eu-north", kid="k-next")
    rotated = RegionKeys("eu-north", "k-next", {**old.keys, **new.keys})
    before_rotation = ticket().sign(old)
    after_rotation = ticket().sign(rotated)
    assert after_rotation.split(".")[1] == "k-next"
    for token in (before_rotation, after_rotation):
        assert Ticket.verify(rotated, token).decision_id == "d1"
    pruned = RegionKeys("eu-north", "k-next", {"k-next": new.keys["k-next"]})
    with pytest.raises(TicketRejected, match="unknown key id"):
        Ticket.verify(pruned, before_rotation)


def test_chat_messages_are_bound_by_role_and_content() -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    same = {"messages": [{"role": "user", "content": "Hi"}], "model": "m"}
    other_role = {"messages": [{"role": "system", "content": "Hi"}]}
    assert body_digest(chat) == body_digest(same)
    assert body_digest(chat) != body_digest(other_role)
    # Content parts (a list) are bound as they are, and differ from the same text as a string.
    parts = body_digest({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
    assert parts is not None and parts != body_digest(chat)
    assert body_digest({"prompt": ["a", "list"]}) is None
    ids = body_digest({"prompt": [1, 2, 3]})
    assert ids is not None and ids[1] == 3  # token ids: their count, exactly
    assert body_digest({"prompt": [1, 2, 3]}) != body_digest({"prompt": "1,2,3"})


def test_the_key_file_round_trips_and_names_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(RING.to_yaml())
    loaded = TicketKeyRing.load(path)
    assert loaded.of("eu-north") == RING.of("eu-north")
    assert loaded.only("us-east").regions.keys() == {"us-east"}
    bad = [
        ("regions: {eu-north: {active: k9, keys: {k1: 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA='}}}",
         "regions.eu-north.active: key id 'k9' is not in keys"),
        ("regions: {eu-north: {active: k1, keys: {k1: 'not base64!'}}}", "regions.eu-north.keys.k1: not base64"),
        ("regions: {eu-north: {active: k1, keys: {k1: 'AAAA'}}}", "at least 16 bytes"),
        ("keys: []", "expected a mapping with one key, 'regions'"),
    ]
    for text, message in bad:
        path.write_text(text)
        with pytest.raises(TicketKeysError) as error:
            TicketKeyRing.load(path)
        assert str(path) in str(error.value) and message in str(error.value)
    with pytest.raises(TicketKeysError, match="no ticket keys for region 'ap-south'"):
        RING.of("ap-south")


def test_keys_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tickets.KEYS_ENV, raising=False)
    monkeypatch.delenv(tickets.KEYS_FILE_ENV, raising=False)
    assert TicketKeyRing.from_env() is None
    path = tmp_path / "keys.yaml"
    path.write_text(RING.only("eu-north").to_yaml())
    monkeypatch.setenv(tickets.KEYS_FILE_ENV, str(path))
    assert set(TicketKeyRing.from_env().regions) == {"eu-north"}  # type: ignore[union-attr]
    monkeypatch.setenv(tickets.KEYS_ENV, RING.to_yaml())  # the content wins over the file
    assert set(TicketKeyRing.from_env().regions) == {"eu-north", "us-east"}  # type: ignore[union-attr]
    monkeypatch.setenv(tickets.KEYS_ENV, "regions: 3")
    with pytest.raises(TicketKeysError, match=r"\$SCHEDULER_TICKET_KEYS: expected a mapping"):
        TicketKeyRing.from_env()


def test_the_issuer_never_signs_beyond_the_limit() -> None:
    from scheduler.server.issuer import TicketIssuer

    with pytest.raises(ValueError, match="ttl_s"):
        TicketIssuer(RING, ttl_s=MAX_TICKET_TTL_S + 1)


def test_the_tickets_command_rotates_extracts_and_prunes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli import main
    from scheduler.plugins.checked_fleet import load_checked_fleet

    regions = {r.name for r in load_checked_fleet().regions}
    first = tmp_path / "keys.yaml"
    assert main(["tickets", "keygen", "--kid", "k1"]) == 0
    first.write_text(capsys.readouterr().out)
    ring = TicketKeyRing.load(first)
    assert set(ring.regions) == regions and all(k.active == "k1" for k in ring.regions.values())
    # Rotation, step 1: every region gets k2, still signing with k1.
    rotated = tmp_path / "rotated.yaml"
    assert main(["tickets", "keygen", "--rotate", str(first), "--kid", "k2"]) == 0
    rotated.write_text(capsys.readouterr().out)
    staged = TicketKeyRing.load(rotated).of("eu-north")
    assert staged.active == "k1" and set(staged.keys) == {"k1", "k2"}
    assert staged.keys["k1"] == ring.of("eu-north").keys["k1"]
    assert main(["tickets", "keygen", "--rotate", str(rotated), "--kid", "k2"]) == 1
    assert "already has key id 'k2'" in capsys.readouterr().err
    # A region's own file: its entry only.
    assert main(["tickets", "extract", "--region", "eu-north", str(rotated)]) == 0
    assert set(TicketKeyRing.parse(capsys.readouterr().out, "stdout").regions) == {"eu-north"}
    # Last step: only the active key stays.
    assert main(["tickets", "prune", str(rotated)]) == 0
    assert set(TicketKeyRing.parse(capsys.readouterr().out, "stdout").of("eu-north").keys) == {"k1"}


def test_claims_signed_in_two_parts_verify_as_the_merged_claims() -> None:
    shared = {"decision_id": "d1", "request_id": "r1", "expires_at": NOW + 30}
    signer = tickets.ClaimsSigner("ticket", shared)
    keys = RING.of("eu-north")
    own = {"region": "eu-north", "pool": "h200-long", "carbon_g_per_kwh": None}
    token = signer.sign(keys, own)
    assert tickets.verify(keys, "ticket", token) == {**shared, **own}
    # Another region's key does not verify it; a receipt's purpose does not either.
    with pytest.raises(TicketRejected, match="unknown key id"):
        tickets.verify(RING.of("us-east"), "ticket", token)
    with pytest.raises(TicketRejected, match="bad receipt signature"):
        tickets.verify(keys, "receipt", token)
    # Either part may be empty; a claim in both is refused, not silently duplicated.
    assert tickets.verify(keys, "ticket", signer.sign(keys, {})) == shared
    assert tickets.verify(keys, "ticket", tickets.ClaimsSigner("ticket", {}).sign(keys, own)) == own
    with pytest.raises(ValueError, match="both shared and own"):
        signer.sign(keys, {"decision_id": "d2"})


@pytest.mark.parametrize("pool", ["p", "pp", "ppp"])
def test_a_ticket_encoded_in_two_parts_is_the_base64_of_its_whole_claims(pool: str) -> None:
    # The own part is padded to whole 3-byte groups, so its base64 and the shared claims' join
    # into the base64 of the whole; pools of three lengths give each remainder of the padding.
    shared = {"decision_id": "d1", "expires_at": NOW + 30}
    signer = tickets.ClaimsSigner("ticket", shared)
    keys = RING.of("eu-north")
    own = {"region": "eu-north", "pool": pool}
    token = signer.sign(keys, own)
    body = token.split(".")[2]
    claims = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert orjson.loads(claims) == {**shared, **own}
    assert tickets.verify(keys, "ticket", token) == {**shared, **own}
    # The part depends on the own claims alone: another dispatch's signer reuses it.
    other = tickets.ClaimsSigner("ticket", {"decision_id": "d2", "expires_at": NOW + 31})
    assert tickets.verify(keys, "ticket", other.sign_part(keys, signer.own_part(own)))["decision_id"] == "d2"


def test_the_issuer_reuses_a_candidates_claims_until_its_carbon_signal_changes() -> None:
    from scheduler import testing
    from scheduler.server.issuer import TicketIssuer

    snap = testing.snapshot(testing.region("eu-north", "EU", zone="NO", carbon=30.0), now=NOW)
    # The same candidates, a new carbon signal.
    newer = dataclasses.replace(snap, carbon={zone: dataclasses.replace(signal, value=45.0)
                                              for zone, signal in snap.carbon.items()})
    issuer = TicketIssuer(RING, clock=lambda: NOW)
    request = testing.request(prompt_tokens=8, max_tokens=64, request_id="r1")
    ring = RING.of("eu-north")

    def carbon(snapshot: FleetSnapshot, decision_id: str) -> object:
        token = issuer.signer(decision_id=decision_id, request=request, body=BODY, endpoint=tickets.COMPLETIONS,
                              snapshot=snapshot,
                              mode="direct")(snapshot.candidates[0])
        ticket = Ticket.verify(ring, token)
        assert ticket.decision_id == decision_id
        return ticket.carbon_g_per_kwh

    assert [carbon(snap, "d1"), carbon(snap, "d2"), carbon(newer, "d3"), carbon(snap, "d4")] == [30.0, 30.0, 45.0, 30.0]


def test_the_issuer_signs_every_ticket_field_and_the_fresh_carbon_only() -> None:
    from scheduler import testing
    from scheduler.server.issuer import TicketIssuer

    snap = testing.snapshot(testing.region("eu-north", "EU", zone="NO", carbon=30.0),
                            testing.region("us-east", "US", zone="PJM", carbon=380.0, carbon_age_s=10 * 3600),
                            now=NOW)
    issuer = TicketIssuer(RING, clock=lambda: NOW)
    request = testing.request(prompt_tokens=8, max_tokens=64, request_id="r1")
    by_region = {c.region.name: c for c in snap.candidates}
    tokens = {mode: {name: issuer.signer(decision_id="d1", request=request, body=BODY, endpoint=tickets.COMPLETIONS,
                                         snapshot=snap,
                                         mode=mode)(c)  # type: ignore[arg-type]
                     for name, c in by_region.items()} for mode in ("direct", "proxy")}
    fields = {f.name for f in dataclasses.fields(Ticket)}
    signed = {}
    for mode, by_name in tokens.items():
        signed[mode] = {name: Ticket.verify(RING.of(name), token) for name, token in by_name.items()}
        for name, issued in signed[mode].items():
            assert set(tickets.verify(RING.of(name), "ticket", by_name[name])) == fields
            assert (issued.region, issued.mode, issued.decision_id, issued.expires_at) == (name, mode, "d1", NOW + 30)
            tickets.check(issued, region=name, now=NOW, body=BODY, pool=issued.pool,
                          endpoint=tickets.COMPLETIONS)
    # Either mode carries the carbon the decision saw while fresh (the region prices its receipt
    # with it); a stale signal, none.
    for mode in ("direct", "proxy"):
        assert (signed[mode]["eu-north"].carbon_g_per_kwh, signed[mode]["eu-north"].carbon_zone) == (30.0, "NO")
        assert signed[mode]["us-east"].carbon_g_per_kwh is None


# --- the ticket binds the whole request (issue 26) -------------------------------------------

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}


def chat_ticket() -> str:
    digest, _ = body_digest(CHAT) or ("", 0)
    return ticket(body_sha256=digest, endpoint=tickets.CHAT_COMPLETIONS).sign(RING.of("eu-north"))


def test_a_chat_ticket_admits_its_own_request() -> None:
    assert admit(chat_ticket(), CHAT, endpoint=tickets.CHAT_COMPLETIONS).endpoint == tickets.CHAT_COMPLETIONS


@settings(max_examples=300, deadline=None)
@given(change=st.one_of(
    st.just(("endpoint", None, None)),
    st.tuples(st.just("prompt"), st.text(min_size=1, max_size=50), st.none()),
    st.tuples(st.just("engine-field"), st.sampled_from(sorted(tickets.ENGINE_FIELDS - tickets.DIGEST_EXCLUDED
                                                              - {"messages", "prompt"})),
              st.one_of(st.integers(0, 5), st.floats(0.1, 2.0), st.text(max_size=20), st.booleans())),
    st.tuples(st.just("foreign-field"), st.text(min_size=1, max_size=20).filter(lambda k: k not in tickets.ENGINE_FIELDS),
              st.one_of(st.integers(), st.text(max_size=50_000))),
    st.tuples(st.just("message-key"), st.text(min_size=1, max_size=20).filter(lambda k: k not in tickets.MESSAGE_KEYS),
              st.text(max_size=50_000)),
))
def test_any_change_to_the_request_or_its_endpoint_is_refused(change: tuple[str, object, object]) -> None:
    """The ticket for one chat request, and that request changed one way: another endpoint, a
    prompt beside the messages, any engine field the ticket was not issued with, any field no
    engine request may carry, an extra key in a message. Every one is a 403."""
    kind, name, value = change
    body: dict[str, object] = {**CHAT, "messages": [dict(m) for m in CHAT["messages"]]}  # type: ignore[attr-defined]
    endpoint = tickets.CHAT_COMPLETIONS
    if kind == "endpoint":
        endpoint = tickets.COMPLETIONS
    elif kind == "prompt":
        body["prompt"] = name
    elif kind in ("engine-field", "foreign-field"):
        body[str(name)] = value
    else:
        body["messages"][0][str(name)] = value  # type: ignore[index]
    with pytest.raises(TicketRejected) as refused:
        admit(chat_ticket(), body, endpoint=endpoint)
    assert refused.value.status == 403, refused.value.reason


@pytest.mark.parametrize("offset_s", [-40.0, -35.1, -34.9, -10.0, 0.0, 4.9, 5.1, 30.0])
@pytest.mark.parametrize("skew_s", [0.0, 5.0, 30.0])
def test_clock_skew_sweep(offset_s: float, skew_s: float) -> None:
    """The region's clock ``offset_s`` from the router's, which signed a ticket good for 30 s:
    accepted while the region sees it unexpired within the tolerance and not expiring more than
    30 s ahead beyond it."""
    issued = ticket(expires_at=NOW + MAX_TICKET_TTL_S).sign(RING.of("eu-north"))
    region_now = NOW + offset_s
    expected = region_now <= NOW + MAX_TICKET_TTL_S + skew_s and NOW + MAX_TICKET_TTL_S - region_now <= \
        MAX_TICKET_TTL_S + skew_s
    try:
        admit(issued, now=region_now, skew_s=skew_s)
        accepted = True
    except TicketRejected as exc:
        assert exc.status == 401
        accepted = False
    assert accepted == expected, (offset_s, skew_s)


def test_each_proxied_attempt_gets_its_own_expiry() -> None:
    """A dispatch's first region hangs 61 s before failing; the router signs the next
    candidate's ticket then, and that ticket is live at the second region (it expires 30 s after
    its own attempt, not the dispatch's start)."""
    from scheduler import testing
    from scheduler.server.issuer import TicketIssuer

    snap = testing.snapshot(testing.region("eu-north", "EU", zone="NO", carbon=30.0),
                            testing.region("us-east", "US", zone="PJM", carbon=380.0), now=NOW)
    clock = [NOW]
    issuer = TicketIssuer(RING, clock=lambda: clock[0])
    request = testing.request(prompt_tokens=8, max_tokens=64, request_id="r1")
    sign = issuer.signer(decision_id="d1", request=request, body=BODY, endpoint=tickets.COMPLETIONS, snapshot=snap,
                         mode="proxy")
    first, second = snap.candidates[0], snap.candidates[1]
    at_first = Ticket.verify(RING.of(first.region.name), sign(first))
    assert at_first.expires_at == NOW + MAX_TICKET_TTL_S
    clock[0] = NOW + 61.0  # the first region hung past its 60 s read timeout
    token = sign(second)
    assert admit(token, region=second.region.name, now=clock[0]).expires_at == NOW + 61.0 + MAX_TICKET_TTL_S
