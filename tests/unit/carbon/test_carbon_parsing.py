"""The providers' parsers on the documented response bodies, and the strict field readers."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

from scheduler.datalayer.carbon import casdk, electricitymaps, ukci, watttime
from scheduler.datalayer.carbon import fields as f
from scheduler.datalayer.carbon.errors import FieldError, ProviderError
from scheduler.datalayer.carbon.http import error_excerpt


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# Bodies as the providers document them (see each module's docstring for the source).
EM_LATEST = {
    "zone": "DE", "carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z",
    "updatedAt": "2019-05-21T00:35:05.893Z", "createdAt": "2019-05-18T00:36:55.593Z",
    "emissionFactorType": "lifecycle", "isEstimated": True, "estimationMethod": "TIME_SLICER_AVERAGE",
}
WT_INDEX = {
    "data": [{"point_time": "2022-07-15T00:00:00+00:00", "value": 53}],
    "meta": {"data_point_period_seconds": 300, "region": "CAISO_NORTH", "signal_type": "co2_moer",
             "units": "percentile", "model": {"date": "2023-03-01"}, "warnings": []},
}
WT_FORECAST = {
    "data": [{"point_time": "2022-07-15T00:00:00+00:00", "value": 870.0},
             {"point_time": "2022-07-15T00:05:00+00:00", "value": 1051.0880801214637}],
    "meta": {"data_point_period_seconds": 300, "region": "CAISO_NORTH", "warnings": [], "signal_type": "co2_moer",
             "model": {"date": "2023-03-01"}, "units": "lbs_co2_per_mwh", "generated_at_period_seconds": 300,
             "generated_at": "2022-07-15T00:00:00+00:00"},
}
UKCI_NOW = {"data": [{"from": "2018-01-20T12:00Z", "to": "2018-01-20T12:30Z",
                      "intensity": {"forecast": 266, "actual": None, "index": "moderate"}}]}
CASDK_EMISSIONS = [{"location": "eastus", "time": "2022-05-17T20:45:11.5092741+00:00", "rating": 70,
                    "duration": "08:00:00"},
                   {"location": "eastus", "time": "2022-05-17T12:45:11.5092741+00:00", "rating": 90,
                    "duration": "08:00:00"}]
CASDK_FORECAST = [{
    "requestedAt": "2022-07-19T13:37:49+00:00", "generatedAt": "2022-07-19T13:35:00+00:00",
    "location": "northeurope", "dataStartAt": "2022-07-19T14:00:00Z", "dataEndAt": "2022-07-20T04:38:00Z",
    "windowSize": 10,
    "optimalDataPoints": [{"location": "IE", "timestamp": "2022-07-19T18:45:00+00:00", "duration": 10,
                           "value": 448.4451043375}],
    "forecastData": [{"location": "IE", "timestamp": "2022-07-19T14:00:00+00:00", "duration": 10,
                      "value": 532.02293146}],
}]


def test_electricitymaps_latest():
    s = electricitymaps.parse_latest(EM_LATEST, "DE", fetched_at=5.0)
    assert (s.kind, s.key, s.value, s.unit) == ("carbon_intensity", "DE", 302.0, "gCO2eq/kWh")
    assert s.observed_at == ts("2019-05-21T00:00:00+00:00") and s.fetched_at == 5.0
    assert s.is_estimated and s.estimation_method == "TIME_SLICER_AVERAGE" and not s.is_forecast
    assert (s.signal_type, s.emission_factors) == ("average", "lifecycle")


def test_electricitymaps_measured_value_has_no_estimation_method():
    s = electricitymaps.parse_latest(EM_LATEST | {"isEstimated": False, "estimationMethod": None}, "DE", 0.0)
    assert not s.is_estimated and s.estimation_method is None


def test_electricitymaps_other_zone_is_unknown_zone():
    with pytest.raises(ProviderError) as caught:
        electricitymaps.parse_latest(EM_LATEST, "FR", 0.0)
    assert caught.value.reason == "unknown_zone"


def test_watttime_index_stays_an_index():
    s = watttime.parse_index(WT_INDEX, "CAISO_NORTH", 0.0)
    assert (s.kind, s.unit, s.value) == ("moer_index", "percent", 53.0)


def test_watttime_forecast_in_grams_per_kwh():
    signals = watttime.parse_moer(WT_FORECAST, "CAISO_NORTH", 0.0, watttime.FORECAST)
    assert [round(s.value, 3) for s in signals] == [round(870.0 * 0.45359237, 3), round(1051.0880801214637 * 0.45359237, 3)]
    assert all(s.is_forecast and s.unit == "gCO2eq/kWh" for s in signals)
    now = watttime.nowcast(signals)
    assert now.value == signals[0].value and now.is_estimated and not now.is_forecast
    # WattTime's MOER: the marginal plants' combustion emissions.
    assert {(x.signal_type, x.emission_factors) for x in [*signals, now]} == {("marginal", "direct")}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (WT_INDEX | {"meta": WT_INDEX["meta"] | {"units": "lbs_co2_per_mwh"}}, "wrong_unit"),
        (WT_INDEX | {"meta": WT_INDEX["meta"] | {"region": "PJM"}}, "unknown_zone"),
        (WT_INDEX | {"data": []}, "no_data"),
        (WT_INDEX | {"data": [{"point_time": "2022-07-15T00:00:00+00:00", "value": 140}]}, "wrong_unit"),
        (WT_INDEX | {"data": [{"point_time": "2022-07-15T00:00:00+00:00", "value": "53"}]}, "bad_field"),
    ],
    ids=["lbs-as-index", "other-region", "empty", "percent-over-100", "string-value"],
)
def test_watttime_index_failures(body, reason):
    with pytest.raises(ProviderError) as caught:
        watttime.parse_index(body, "CAISO_NORTH", 0.0)
    assert caught.value.reason == reason


def test_watttime_percentile_never_parsed_as_grams():
    with pytest.raises(ProviderError) as caught:
        watttime.parse_moer(WT_INDEX, "CAISO_NORTH", 0.0, watttime.FORECAST)
    assert caught.value.reason == "wrong_unit" and "percentile" in caught.value.detail


def test_ukci_null_actual_uses_forecast():
    (s,) = ukci.parse_periods(UKCI_NOW, "GB", 0.0, ukci.INTENSITY, ahead=False)
    assert s.value == 266.0 and s.is_forecast and s.is_estimated and s.estimation_method == "ukci-forecast"
    assert (s.signal_type, s.emission_factors) == ("average", "direct")
    assert s.observed_at == ts("2018-01-20T12:00:00+00:00")


def test_ukci_half_hour_format():
    t = ts("2024-03-01T10:47:12+00:00")
    assert ukci.half_hour(t) == "2024-03-01T10:30Z"


def test_casdk_emissions_sorted_and_seven_digit_fractions():
    signals = casdk.parse_emissions(CASDK_EMISSIONS, "eastus", 0.0)
    assert [s.value for s in signals] == [90.0, 70.0]
    assert signals[-1].observed_at == pytest.approx(ts("2022-05-17T20:45:11.509274+00:00"))


def test_casdk_forecast():
    (s,) = casdk.parse_forecast(CASDK_FORECAST, "northeurope", 0.0)
    assert s.value == pytest.approx(532.02293146) and s.is_forecast
    assert s.observed_at == ts("2022-07-19T14:00:00+00:00")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2018-01-20T12:00Z", "2018-01-20T12:00:00+00:00"),
        ("2019-05-21T00:00:00.000Z", "2019-05-21T00:00:00+00:00"),
        ("2022-07-15T02:00:00+02:00", "2022-07-15T00:00:00+00:00"),
    ],
)
def test_timestamps(text, expected):
    assert f.timestamp({"t": text}, "t", "x") == ts(expected)


@pytest.mark.parametrize("value", ["2022-07-15T00:00:00", "noon", 1657843200, None])
def test_bad_timestamps(value):
    with pytest.raises(FieldError):
        f.timestamp({"t": value}, "t", "x")


@pytest.mark.parametrize("value", [True, "300", None, float("nan"), float("inf"), [300]])
def test_numbers_must_be_numbers(value):
    with pytest.raises(FieldError, match=r"x\.v"):
        f.number({"v": value}, "v", "x")


def test_intensity_range():
    assert f.intensity(0.0, "x") == 0.0 and f.intensity(2000.0, "x") == 2000.0
    for bad in (-1.0, 2000.1):  # signal_check's bounds: what parses is never refused for its size
        with pytest.raises(FieldError):
            f.intensity(bad, "x")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, {"error": "Invalid auth-token", "message": "The provided token is invalid."},
         "Invalid auth-token; The provided token is invalid."),
        (400, {"error": {"code": "400 Bad Request", "message": "Please enter a valid date"}},
         "400 Bad Request; Please enter a valid date"),
        (400, {"title": "One or more validation errors occurred.", "status": 400,
               "errors": {"location": ["The location field is required."]}},
         "One or more validation errors occurred.; location: The location field is required."),
        (403, "Access denied", "Access denied"),
        (502, "", "(empty body)"),
    ],
    ids=["electricitymaps", "ukci", "casdk", "plain-text", "empty"],
)
def test_error_excerpt(status, body, expected):
    content = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
    assert error_excerpt(httpx.Response(status, content=content)) == expected


def test_parsed_times_are_utc_epochs():
    s = electricitymaps.parse_latest(EM_LATEST, "DE", 0.0)
    assert datetime.fromtimestamp(s.observed_at, tz=UTC).hour == 0
