"""Network round trip from a client to each candidate's region.

    rtt_s = 2 x great-circle km x ROUTE_FACTOR / FIBRE_KM_PER_S + BASE_RTT_S

(light in fibre covers ~200,000 km/s; real routes run ~1.4 x the great circle; a fixed
2 ms for the last miles and the load balancers). 0 when the request gives no location.
Reads: the client's location, the regions' locations (the framework's columns).
"""

from __future__ import annotations

import numpy as np

from scheduler.framework.columns import FloatArray, Frame
from scheduler.types import FleetSnapshot, GeoPoint

FIBRE_KM_PER_S = 200_000.0
ROUTE_FACTOR = 1.4
BASE_RTT_S = 0.002
EARTH_KM = 6371.0
# Client locations whose RTT rows one frame's memo keeps before it starts over.
RTT_MEMO_LIMIT = 4096


def rtt_row(lat_rad: FloatArray, lon_rad: FloatArray, client: GeoPoint) -> FloatArray:
    lat, lon = np.radians(client.lat), np.radians(client.lon)
    a = np.sin((lat_rad - lat) / 2) ** 2 + np.cos(lat) * np.cos(lat_rad) * np.sin((lon_rad - lon) / 2) ** 2
    km = 2 * EARTH_KM * np.arcsin(np.sqrt(np.minimum(a, 1.0)))
    row: FloatArray = 2 * km * ROUTE_FACTOR / FIBRE_KM_PER_S + BASE_RTT_S
    return row


def rtt_s(snapshot: FleetSnapshot, frame: Frame, client: GeoPoint | None) -> FloatArray | None:
    """Round trip from ``client`` to each of the frame's candidates (None: no location),
    memoized per client location for the frame's candidates (``Frame.rtt_memo``)."""
    if client is None:
        return None
    if not len(frame.index):
        return np.zeros(0)
    memo = frame.rtt_memo
    key = (client.lat, client.lon)
    row = memo.get(key)
    if row is None:
        if len(memo) >= RTT_MEMO_LIMIT:
            memo.clear()
        row = memo[key] = rtt_row(frame.lat_rad, frame.lon_rad, client)
    return row
