"""Each provider against a local server that answers like its documented API: requests,
authentication, responses, error bodies, and the faults every provider must survive
(garbage, missing or mistyped fields, slow answers, 5xx, 429)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import PROVIDER_RETRY
from scheduler.datalayer.carbon.providers import make_provider
from scheduler.datalayer.carbon.watttime import LBS_PER_MWH_TO_G_PER_KWH
from tests.integration.carbon.carbon_apis import CasdkApi, ElectricityMapsApi, Reply, UkciApi, WattTimeApi

pytestmark = pytest.mark.integration

EM_KEY = {"ELECTRICITYMAPS_API_KEY": "em-secret"}
WT_CREDS = {"WATTTIME_USERNAME": "alice", "WATTTIME_PASSWORD": "s3cret"}
HOUR = 3600.0


def hour_ago() -> float:
    now = time.time()
    return now - now % HOUR


# --- Electricity Maps ----------------------------------------------------------------------

async def test_electricitymaps_latest_and_forecast(serve, options):
    at = hour_ago()
    api = ElectricityMapsApi("em-secret", {"DE": (312.0, at)}, estimated=True)
    server = serve(api)
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    fetched = await provider.fetch("DE")
    await provider.aclose()

    assert fetched.failures == ()
    (latest,) = fetched.latest
    assert (latest.key, latest.value, latest.unit, latest.observed_at) == ("DE", 312.0, "gCO2eq/kWh", at)
    assert latest.is_estimated and latest.estimation_method == "TIME_SLICER_AVERAGE"
    assert latest.source == "electricitymaps:/v3/carbon-intensity/latest"
    assert len(fetched.forecast) == 24 and all(s.is_forecast for s in fetched.forecast)
    assert fetched.forecast[0].observed_at == at + HOUR
    # Every request names the zone (never the IP fallback) and carries the key header.
    assert server.paths() == ["/v3/carbon-intensity/latest", "/v3/carbon-intensity/forecast"]
    assert all(s.query["zone"] == "DE" and s.headers["auth-token"] == "em-secret" for s in server.seen)
    assert all(s.query["emissionFactorType"] == "lifecycle" for s in server.seen)


async def test_electricitymaps_history(serve, options):
    at = hour_ago()
    server = serve(ElectricityMapsApi("em-secret", {"DE": (300.0, at)}))
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    history = await provider.history("DE")
    await provider.aclose()
    assert len(history) == 24 and history[-1].observed_at == at and history[-1].value == 323.0
    assert not any(s.is_forecast for s in history)


@pytest.mark.parametrize(
    ("env", "plan", "reason", "detail"),
    [
        ({"ELECTRICITYMAPS_API_KEY": "wrong"}, None, "auth", "The provided token is invalid"),
        (EM_KEY, {"FR"}, "auth", "HTTP 403: Access denied"),
    ],
    ids=["401-invalid-token", "403-zone-not-in-plan"],
)
async def test_electricitymaps_auth_errors_are_not_retried(serve, options, sleeps, env, plan, reason, detail):
    server = serve(ElectricityMapsApi("em-secret", {"DE": (300.0, hour_ago())}, plan_zones=plan))
    provider = make_provider("electricitymaps", options(server, env))
    fetched = await provider.fetch("DE")
    await provider.aclose()
    assert fetched.latest == () and fetched.forecast == ()
    assert {f.reason for f in fetched.failures} == {reason}
    assert all(detail in f.detail for f in fetched.failures), [f.detail for f in fetched.failures]
    assert len(server.seen) == 2 and sleeps.calls == []  # one try per endpoint


async def test_electricitymaps_without_key_fails_with_config_before_any_request(serve, options):
    server = serve(ElectricityMapsApi("em-secret", {"DE": (300.0, hour_ago())}))
    provider = make_provider("electricitymaps", options(server, {}))
    fetched = await provider.fetch("DE")
    await provider.aclose()
    assert {f.reason for f in fetched.failures} == {"config"} and server.seen == []


async def test_electricitymaps_answer_for_another_zone_is_rejected(serve, options):
    """If the API answers for a different zone (its IP-location fallback), we never use it."""
    at = hour_ago()
    server = serve(ElectricityMapsApi("em-secret", {"DE": (300.0, at), "NL": (250.0, at)}))
    server.push(Reply(200, ElectricityMapsApi("em-secret", {}).point("NL", 250.0, at)))
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    with pytest.raises(ProviderError) as caught:
        await provider.latest("DE")  # type: ignore[attr-defined]
    await provider.aclose()
    assert caught.value.reason == "unknown_zone" and "'NL'" in caught.value.detail


# --- WattTime --------------------------------------------------------------------------------

async def test_watttime_login_bearer_units_and_index(serve, options):
    now = time.time()
    api = WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=now)
    server = serve(api)
    provider = make_provider("watttime", options(server, WT_CREDS))
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()

    assert fetched.failures == ()
    moer, index = fetched.latest
    assert moer.kind == "carbon_intensity" and moer.unit == "gCO2eq/kWh"
    assert moer.value == pytest.approx(900.0 * 0.4536, rel=1e-4) == 900.0 * LBS_PER_MWH_TO_G_PER_KWH
    assert moer.is_estimated and not moer.is_forecast
    # The percentile stays an index: its own kind and unit, never a g/kWh value.
    assert (index.kind, index.unit, index.value) == ("moer_index", "percent", 37.0)
    assert [s.value for s in fetched.forecast[:2]] == pytest.approx([900.0 * 0.45359237, 901.0 * 0.45359237])
    assert all(s.is_forecast for s in fetched.forecast)
    assert server.paths() == ["/login", "/v3/forecast", "/v3/signal-index"]
    assert server.seen[0].headers["authorization"].startswith("Basic ")
    assert all(s.headers["authorization"] == "Bearer token-1" for s in server.seen[1:])
    assert all(s.query == {"region": "CAISO_NORTH", "signal_type": "co2_moer"} for s in server.seen[1:])


async def test_watttime_expired_token_forces_one_new_login(serve, options):
    api = WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time())
    server = serve(api)
    provider = make_provider("watttime", options(server, WT_CREDS))
    assert (await provider.fetch("CAISO_NORTH")).failures == ()
    api.expire_tokens()  # 30 minutes later, as far as the server is concerned
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert fetched.failures == () and len(fetched.latest) == 2
    assert api.logins == 2
    assert server.paths()[3:] == ["/v3/forecast", "/login", "/v3/forecast", "/v3/signal-index"]
    assert server.seen[-1].headers["authorization"] == "Bearer token-2"


async def test_watttime_wrong_password_is_an_auth_failure(serve, options):
    server = serve(WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time()))
    provider = make_provider("watttime", options(server, {**WT_CREDS, "WATTTIME_PASSWORD": "nope"}))
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert fetched.latest == () and {f.reason for f in fetched.failures} == {"auth"}
    assert "Invalid username or password" in fetched.failures[0].detail


async def test_watttime_429_waits_for_retry_after(serve, options, sleeps):
    server = serve(WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time()))
    server.push(Reply(200, {"token": "token-0"}))  # the login
    server.push(Reply(429, {"error": "Too Many Requests", "message": "rate limit"}, {"Retry-After": "2"}))
    api = server.route
    api.tokens.add("token-0")  # type: ignore[attr-defined]
    provider = make_provider("watttime", options(server, WT_CREDS))
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert fetched.failures == ()
    assert sleeps.calls == [2.0]
    assert server.paths() == ["/login", "/v3/forecast", "/v3/forecast", "/v3/signal-index"]


async def test_watttime_429_with_a_long_retry_after_gives_up_at_once(serve, options, sleeps):
    server = serve(WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time()))
    server.push(Reply(200, {"token": "t"}), Reply(429, {"error": "Too Many Requests"}, {"Retry-After": "3600"}))
    server.route.tokens.add("t")  # type: ignore[attr-defined]
    provider = make_provider("watttime", options(server, WT_CREDS))
    with pytest.raises(ProviderError) as caught:
        await provider.forecast("CAISO_NORTH")  # type: ignore[attr-defined]
    await provider.aclose()
    assert caught.value.reason == "rate_limited" and "3600" in caught.value.detail
    assert sleeps.calls == []


async def test_watttime_unexpected_units_are_refused(serve, options):
    api = WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time(),
                      units="kg_co2_per_mwh")
    server = serve(api)
    provider = make_provider("watttime", options(server, WT_CREDS))
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert [s.kind for s in fetched.latest] == ["moer_index"]  # the index still arrives
    assert [f.reason for f in fetched.failures] == ["wrong_unit"]
    assert "kg_co2_per_mwh" in fetched.failures[0].detail


# --- UK Carbon Intensity ---------------------------------------------------------------------

async def test_ukci_open_period_uses_the_forecast_and_says_so(serve, options):
    now = time.time()
    server = serve(UkciApi(now=now, forecast=180.0, actual=None))
    provider = make_provider("ukci", options(server))
    fetched = await provider.fetch("GB")
    await provider.aclose()
    assert fetched.failures == ()
    (latest,) = fetched.latest
    assert latest.value == 180.0 and latest.is_forecast and latest.is_estimated
    # /intensity answers with the last complete half hour: dated by that slot's ``from``.
    assert latest.observed_at == now - now % 1800 - 1800
    # fw24h's first slot (it ends at ``from``, already past) is no forecast.
    assert len(fetched.forecast) == 47 and all(s.is_forecast for s in fetched.forecast)
    assert fetched.forecast[0].observed_at == now - now % 1800
    start = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(now - now % 1800))
    assert server.paths() == ["/intensity", f"/intensity/{start}/fw24h"]


async def test_ukci_settled_period_uses_the_actual(serve, options):
    server = serve(UkciApi(now=time.time(), forecast=180.0, actual=171.0))
    provider = make_provider("ukci", options(server))
    (latest,) = (await provider.fetch("GB")).latest
    history = await provider.history("GB")
    await provider.aclose()
    assert latest.value == 171.0 and not latest.is_forecast and not latest.is_estimated
    assert len(history) == 48 and not any(s.is_forecast for s in history)


async def test_ukci_error_body_and_unknown_zone(serve, options):
    server = serve(UkciApi(now=time.time(), forecast=180.0, actual=None))
    server.push(Reply(400, {"error": {"code": "400 Bad Request", "message": "Please enter a valid date"}}))
    provider = make_provider("ukci", options(server))
    fetched = await provider.fetch("GB")
    not_gb = await provider.fetch("DE")
    await provider.aclose()
    assert [(f.reason, f.status) for f in fetched.failures] == [("http_4xx", 400)]
    assert "400 Bad Request; Please enter a valid date" in fetched.failures[0].detail
    assert {f.reason for f in not_gb.failures} == {"unknown_zone"}


# --- Carbon Aware SDK --------------------------------------------------------------------------

async def test_casdk_latest_forecast_and_validation_error(serve, options):
    now = time.time()
    server = serve(CasdkApi(now=now, ratings={"eastus": 420.0}))
    provider = make_provider("casdk", options(server))
    fetched = await provider.fetch("eastus")
    wrong = await provider.fetch("mars")
    await provider.aclose()
    assert fetched.failures == ()
    (latest,) = fetched.latest
    assert latest.value == 420.0 and latest.observed_at == now - now % 300  # the newest interval
    assert len(fetched.forecast) == 12 and fetched.forecast[1].value == 421.0
    bylocation = server.seen[0]
    assert bylocation.path == "/emissions/bylocation" and bylocation.query["location"] == "eastus"
    assert {"time", "toTime"} <= bylocation.query.keys()
    assert [f.reason for f in wrong.failures] == ["http_4xx", "http_4xx"]
    assert "One or more validation errors occurred.; location: Location 'mars' not found" in wrong.failures[0].detail


async def test_casdk_empty_answer_is_no_data(serve, options):
    server = serve(CasdkApi(now=time.time(), ratings={"eastus": 420.0}))
    server.push(Reply(200, []), Reply(204, b""))
    provider = make_provider("casdk", options(server))
    fetched = await provider.fetch("eastus")
    await provider.aclose()
    assert [f.reason for f in fetched.failures] == ["no_data", "no_data"]


# --- faults every provider must survive ---------------------------------------------------

def em(server_factory):
    return server_factory(ElectricityMapsApi("em-secret", {"DE": (300.0, hour_ago())})), "electricitymaps", "DE", EM_KEY


def uk(server_factory):
    return server_factory(UkciApi(now=time.time(), forecast=180.0, actual=None)), "ukci", "GB", {}


def ca(server_factory):
    return server_factory(CasdkApi(now=time.time(), ratings={"eastus": 420.0})), "casdk", "eastus", {}


PROVIDER_SERVERS = [em, uk, ca]


@pytest.mark.parametrize("setup", PROVIDER_SERVERS, ids=lambda s: s.__name__)
@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(200, "<html><body>502 Bad Gateway</body></html>"), "invalid_json"),
        (Reply(200, b"\xff\xfe\x00garbage"), "invalid_json"),
        (Reply(200, {"unexpected": "shape"}), "bad_field"),
        (Reply(200, [1, 2, 3]), "bad_field"),
    ],
    ids=["html", "binary", "wrong-object", "wrong-array"],
)
async def test_garbage_bodies_are_failures_not_values(serve, options, setup, reply, reason):
    server, name, zone, env = setup(serve)
    server.push(reply)
    provider = make_provider(name, options(server, env))
    fetched = await provider.fetch(zone)
    await provider.aclose()
    assert fetched.latest == ()
    assert fetched.failures[0].reason == reason


@pytest.mark.parametrize(
    ("field_name", "value", "reason"),
    [
        ("carbonIntensity", "high", "bad_field"),
        ("carbonIntensity", None, "bad_field"),
        ("carbonIntensity", -40, "bad_field"),
        ("carbonIntensity", 41000, "bad_field"),  # a unit slip (mg, or per MWh)
        ("datetime", "yesterday", "bad_field"),
        ("datetime", "2024-05-01T10:00:00", "bad_field"),  # no offset: ambiguous
        ("isEstimated", "no", "bad_field"),
        ("emissionFactorType", "direct", "wrong_unit"),
    ],
)
async def test_electricitymaps_mistyped_fields(serve, options, field_name, value, reason):
    at = hour_ago()
    api = ElectricityMapsApi("em-secret", {"DE": (300.0, at)})
    server = serve(api)
    body = api.point("DE", 300.0, at) | {field_name: value}
    server.push(Reply(200, body))
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    with pytest.raises(ProviderError) as caught:
        await provider.latest("DE")  # type: ignore[attr-defined]
    await provider.aclose()
    assert caught.value.reason == reason and field_name in caught.value.detail


async def test_electricitymaps_missing_field_names_it(serve, options):
    at = hour_ago()
    api = ElectricityMapsApi("em-secret", {"DE": (300.0, at)})
    server = serve(api)
    body = api.point("DE", 300.0, at)
    del body["carbonIntensity"]
    server.push(Reply(200, body))
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    with pytest.raises(ProviderError, match=r"response\.carbonIntensity: missing"):
        await provider.latest("DE")  # type: ignore[attr-defined]
    await provider.aclose()


@pytest.mark.parametrize("setup", PROVIDER_SERVERS, ids=lambda s: s.__name__)
async def test_slower_than_the_timeout_is_a_timeout_after_retries(serve, options, sleeps, setup):
    server, name, zone, env = setup(serve)
    slow = Reply(200, {}, delay_s=1.0)
    server.push(slow, slow, slow, slow, slow, slow)
    provider = make_provider(name, options(server, env, timeout_s=0.2, retry=dataclasses.replace(PROVIDER_RETRY, attempts=2)))
    started = time.monotonic()
    fetched = await provider.fetch(zone)
    elapsed = time.monotonic() - started
    await provider.aclose()
    assert [f.reason for f in fetched.failures] == ["timeout", "timeout"]
    assert len(server.seen) == 4 and len(sleeps.calls) == 2
    assert elapsed < 2.0  # 4 tries of 0.2 s, not 4 of the server's 1 s


@pytest.mark.parametrize("setup", PROVIDER_SERVERS, ids=lambda s: s.__name__)
async def test_5xx_is_retried_with_jittered_backoff(serve, options, sleeps, setup):
    server, name, zone, env = setup(serve)
    server.push(Reply(503, "Service Unavailable"), Reply(502, "Bad Gateway"))
    provider = make_provider(name, options(server, env))
    fetched = await provider.fetch(zone)
    await provider.aclose()
    assert fetched.failures == () and len(fetched.latest) == 1
    policy = PROVIDER_RETRY
    assert len(sleeps.calls) == 2
    assert 0 <= sleeps.calls[0] <= policy.initial_backoff_s and 0 <= sleeps.calls[1] <= 2 * policy.initial_backoff_s


async def test_persistent_5xx_gives_the_status_and_body(serve, options, sleeps):
    server, name, zone, env = em(serve)
    server.push(*[Reply(500, {"status": "error", "message": "internal"})] * 3)
    provider = make_provider(name, options(server, env))
    with pytest.raises(ProviderError) as caught:
        await provider.latest(zone)  # type: ignore[attr-defined]
    await provider.aclose()
    assert (caught.value.reason, caught.value.status) == ("http_5xx", 500)
    assert "internal" in caught.value.detail and len(sleeps.calls) == 2


async def test_connection_refused_is_connect(options, sleeps):
    from tests.integration.carbon.carbon_apis import ApiServer

    dead = ApiServer(lambda seen: Reply(200, {}))  # bound, then closed: nothing listens on the port
    url = dead.url
    dead._httpd.server_close()
    provider = make_provider("ukci", options(dead, base_url=url))
    fetched = await provider.fetch("GB")
    await provider.aclose()
    assert {f.reason for f in fetched.failures} == {"connect"}
