"""Local HTTP servers that answer like the carbon providers' documented APIs: the same paths,
query parameters, authentication and error bodies (see each provider module's docstring for
the sources). Real servers on 127.0.0.1 port 0, in a thread, so real httpx clients talk to
them; ``push`` queues scripted replies (faults, garbage, slow answers) ahead of the emulation.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list: JSON; str/bytes: sent as is
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names


def iso(t: float, fmt: str = "%Y-%m-%dT%H:%M:%S.000Z") -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime(fmt)


class ApiServer:
    def __init__(self, route: Callable[[Seen], Reply]) -> None:
        self.route = route
        self.seen: list[Seen] = []
        self.queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                seen = Seen(parts.path, dict(parse_qsl(parts.query)), {k.lower(): v for k, v in self.headers.items()})
                with server._lock:
                    server.seen.append(seen)
                    reply = server.queue.popleft() if server.queue else None
                reply = reply or server.route(seen)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                body = reply.body
                if isinstance(body, dict | list):
                    data, ctype = json.dumps(body).encode(), "application/json"
                else:
                    data = body.encode() if isinstance(body, str) else (body or b"")
                    ctype = "text/plain"
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.headers.get("Content-Type", ctype))
                    for name, value in reply.headers.items():
                        if name != "Content-Type":
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: the port closes, so clients get connection refused (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


# --- Electricity Maps v3 ------------------------------------------------------------------

EM_MISSING_TOKEN = {
    "error": "Invalid auth-token",
    "message": "Please provide a valid authentication header. See "
    "https://portal.electricitymaps.com/docs/getting-started#authorization for details",
}
EM_BAD_TOKEN = {
    "error": "Invalid auth-token",
    "message": "The provided token is invalid. If this token used to work, please visit "
    "https://help.electricitymaps.com to get support",
}


@dataclass
class ElectricityMapsApi:
    """Zones served with (value, datetime) per zone; ``plan_zones``: what the key may query
    (others: 403 Access denied). A request without ``zone`` is answered for ``ip_zone``, as
    the real API falls back to the caller's IP location."""

    key: str
    values: dict[str, tuple[float, float]]
    plan_zones: set[str] | None = None
    ip_zone: str = "NL"
    estimated: bool = False
    # Endpoints the key's plan covers (None: all); others answer 403, as a free-tier key's
    # forecast does.
    plan_paths: set[str] | None = None

    def point(self, zone: str, value: float, at: float) -> dict[str, Any]:
        return {
            "zone": zone, "carbonIntensity": value, "datetime": iso(at), "updatedAt": iso(at + 1800),
            "createdAt": iso(at - 86400), "emissionFactorType": "lifecycle", "isEstimated": self.estimated,
            "estimationMethod": "TIME_SLICER_AVERAGE" if self.estimated else None,
        }

    def __call__(self, seen: Seen) -> Reply:
        token = seen.headers.get("auth-token")
        if token is None:
            return Reply(401, EM_MISSING_TOKEN)
        if token != self.key:
            return Reply(401, EM_BAD_TOKEN)
        zone = seen.query.get("zone", self.ip_zone)
        if self.plan_zones is not None and zone not in self.plan_zones:
            return Reply(403, "Access denied")
        if self.plan_paths is not None and seen.path not in self.plan_paths:
            return Reply(403, "Access denied")
        if zone not in self.values:
            return Reply(404, {"status": "error", "message": f"Zone '{zone}' does not exist."})
        value, at = self.values[zone]
        if seen.path == "/v3/carbon-intensity/latest":
            return Reply(200, self.point(zone, value, at))
        if seen.path == "/v3/carbon-intensity/history":
            return Reply(200, {"zone": zone, "history": [self.point(zone, value + h, at - 3600 * (23 - h))
                                                         for h in range(24)]})
        if seen.path == "/v3/carbon-intensity/forecast":
            return Reply(200, {"zone": zone, "updatedAt": iso(at), "forecast": [
                {"carbonIntensity": value + h, "datetime": iso(at + 3600 * h)} for h in range(1, 25)]})
        return Reply(404, {"status": "error", "message": "Not found"})


# --- WattTime v3 ------------------------------------------------------------------------

@dataclass
class WattTimeApi:
    """Basic-auth ``/login`` issuing tokens; ``expire_tokens()`` makes every issued token
    answer 401 (as after its 30 minutes), or ``expire_tokens(html_403=True)`` the 403 HTML page
    an expired token can also get. ``moer``: lbs/MWh; ``percentile``: 0-100. ``plan_paths``:
    the endpoints the plan covers (others: 403 "Invalid scope", whatever the token)."""

    username: str
    password: str
    moer: dict[str, float]
    percentile: float
    now: float
    plan_regions: set[str] | None = None
    units: str = "lbs_co2_per_mwh"
    plan_paths: set[str] | None = None
    tokens: set[str] = field(default_factory=set)
    expired: set[str] = field(default_factory=set)
    expired_html_403: bool = False
    logins: int = 0

    def expire_tokens(self, html_403: bool = False) -> None:
        self.expired |= self.tokens
        self.tokens.clear()
        self.expired_html_403 = html_403

    def meta(self, region: str, units: str) -> dict[str, Any]:
        return {"region": region, "signal_type": "co2_moer", "units": units, "data_point_period_seconds": 300,
                "model": {"date": "2023-03-01"}, "warnings": []}

    def __call__(self, seen: Seen) -> Reply:
        if seen.path == "/login":
            expected = "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            if seen.headers.get("authorization") != expected:
                return Reply(403, {"error": "Forbidden", "message": "Invalid username or password"})
            self.logins += 1
            token = f"token-{self.logins}"
            self.tokens.add(token)
            return Reply(200, {"token": token})
        bearer = seen.headers.get("authorization", "").removeprefix("Bearer ")
        if bearer in self.expired and self.expired_html_403:
            return Reply(403, "<html><head><title>403 Forbidden</title></head><body><h1>403 Forbidden</h1>"
                         "</body></html>", {"Content-Type": "text/html"})
        if bearer not in self.tokens:
            return Reply(401, {"error": "Unauthorized", "message": "Token is invalid or expired"})
        if self.plan_paths is not None and seen.path not in self.plan_paths:
            return Reply(403, {"error": "Invalid query parameters", "message": "Invalid scope. You do not have "
                               "sufficient access to this resource."})
        region = seen.query.get("region", "")
        if seen.query.get("signal_type") != "co2_moer" or not region:
            return Reply(400, {"error": "Invalid query parameters", "message": "region and signal_type are required"})
        if region not in self.moer or (self.plan_regions is not None and region not in self.plan_regions):
            return Reply(403, {"error": "Invalid query parameters", "message": "Invalid scope. You do not have "
                               "sufficient access to this resource."})
        start = self.now - self.now % 300
        if seen.path == "/v3/signal-index":
            return Reply(200, {"data": [{"point_time": iso(start, "%Y-%m-%dT%H:%M:%S+00:00"),
                                         "value": self.percentile}], "meta": self.meta(region, "percentile")})
        if seen.path in ("/v3/forecast", "/v3/historical"):
            step = 300 if seen.path == "/v3/forecast" else -300
            points = [{"point_time": iso(start + step * i, "%Y-%m-%dT%H:%M:%S+00:00"), "value": self.moer[region] + i}
                      for i in range(12)]
            meta = self.meta(region, self.units)
            if seen.path == "/v3/forecast":
                meta |= {"generated_at": iso(start, "%Y-%m-%dT%H:%M:%S+00:00"), "generated_at_period_seconds": 300}
            else:
                points.reverse()
            return Reply(200, {"data": points, "meta": meta})
        return Reply(404, {"error": "Not Found", "message": seen.path})


# --- UK Carbon Intensity ----------------------------------------------------------------

UKCI_BAD_DATE = {"error": {"code": "400 Bad Request",
                           "message": "Please enter a valid date in ISO8601 format YYYY-MM-DDThh:mmZ"}}


@dataclass
class UkciApi:
    """As served: ``/intensity`` answers with the latest *complete* half hour (at 12:10 the slot
    11:30-12:00), and ``/intensity/{from}/fw24h`` starts with the slot that ends at ``from``."""

    now: float
    forecast: float
    actual: float | None  # the answered half hour's actual (None: not settled yet)

    def period(self, start: float, forecast: float, actual: float | None) -> dict[str, Any]:
        return {"from": iso(start, "%Y-%m-%dT%H:%MZ"), "to": iso(start + 1800, "%Y-%m-%dT%H:%MZ"),
                "intensity": {"forecast": forecast, "actual": actual, "index": "moderate"}}

    def __call__(self, seen: Seen) -> Reply:
        current = self.now - self.now % 1800
        if seen.path == "/intensity":
            return Reply(200, {"data": [self.period(current - 1800, self.forecast, self.actual)]})
        parts = seen.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "intensity" and parts[2] in ("fw24h", "pt24h"):
            try:
                start = datetime.strptime(parts[1], "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC).timestamp()
            except ValueError:
                return Reply(400, UKCI_BAD_DATE)
            if parts[2] == "fw24h":
                return Reply(200, {"data": [self.period(start + 1800 * i, self.forecast + i, None)
                                            for i in range(-1, 47)]})
            return Reply(200, {"data": [self.period(start - 1800 * i, self.forecast - i, self.forecast - i + 3)
                                        for i in range(48, 0, -1)]})
        return Reply(400, {"error": {"code": "400 Bad Request", "message": f"Invalid route {seen.path}"}})


# --- Carbon Aware SDK WebAPI ------------------------------------------------------------

def validation_problem(field_name: str, message: str) -> dict[str, Any]:
    return {"type": "https://tools.ietf.org/html/rfc7231#section-6.5.1",
            "title": "One or more validation errors occurred.", "status": 400,
            "traceId": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            "errors": {field_name: [message]}}


@dataclass
class CasdkApi:
    """``region``: the data source's region name the SDK answers with in ``location`` (as when
    backed by WattTime: ``westus`` -> ``CAISO_NORTH``); None: the location asked for."""

    now: float
    ratings: dict[str, float]
    region: str | None = None

    def __call__(self, seen: Seen) -> Reply:
        location = seen.query.get("location")
        if not location:
            return Reply(400, validation_problem("location", "The location field is required."))
        if location not in self.ratings:
            return Reply(400, validation_problem("location", f"Location '{location}' not found"))
        rating = self.ratings[location]
        answered = self.region or location
        start = self.now - self.now % 300
        if seen.path == "/emissions/bylocation":
            return Reply(200, [{"location": answered, "time": iso(start - 300 * i, "%Y-%m-%dT%H:%M:%S+00:00"),
                                "rating": rating - i, "duration": "00:05:00"} for i in range(3)])
        if seen.path == "/emissions/forecasts/current":
            points = [{"location": answered, "timestamp": iso(start + 300 * i, "%Y-%m-%dT%H:%M:%S+00:00"),
                       "duration": 5, "value": rating + i} for i in range(12)]
            return Reply(200, [{"generatedAt": iso(start, "%Y-%m-%dT%H:%M:%S+00:00"),
                                "requestedAt": iso(self.now, "%Y-%m-%dT%H:%M:%S+00:00"), "location": location,
                                "dataStartAt": points[0]["timestamp"], "dataEndAt": points[-1]["timestamp"],
                                "windowSize": 5, "optimalDataPoints": [points[0]], "forecastData": points}])
        return Reply(404, {"type": "https://tools.ietf.org/html/rfc7231#section-6.5.4", "title": "Not Found",
                           "status": 404})
