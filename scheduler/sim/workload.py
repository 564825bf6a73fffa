"""The simulated workload: a real request trace, tiled and scaled to a rate and duration, with
a client location, residency rule, workload class and prefix key drawn for each request.

Traces are CSV files with ``TIMESTAMP,ContextTokens,GeneratedTokens`` (the Azure LLM
inference traces of 2023, shipped in ``scheduler/data/traces``). Arrivals keep the trace's
own burstiness: request i of the tiled sequence arrives at

    start + (i // n x tile_span + offset[i mod n]) x native_rate / rate

where n is the trace length, offset the time since its first request and tile_span its span
plus one mean gap. Output length is the trace's GeneratedTokens and is passed to the scheduler
as ``max_tokens`` (the scheduler predicts with the true output length).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from scheduler.sim.slots import slot_setters
from scheduler.sim.workflow_spec import WorkflowColumns
from scheduler.types import WORKLOAD_CLASSES, GeoPoint, Request, WorkloadClass

TRACES_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
SHIPPED_TRACES = {
    "conv": TRACES_DIR / "azure_llm_2023_conv.csv",
    "code": TRACES_DIR / "azure_llm_2023_code.csv",
}


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class Trace:
    name: str
    offsets_s: np.ndarray  # seconds since the first request, ascending
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def span_s(self) -> float:
        """Span plus one mean gap, so that tiles follow each other at the trace's rate."""
        n = len(self.offsets_s)
        last = float(self.offsets_s[-1])
        return last * n / (n - 1) if n > 1 and last > 0 else 1.0

    @property
    def native_rate(self) -> float:
        return len(self.offsets_s) / self.span_s


def load_trace(spec: str) -> Trace:
    """``conv``, ``code`` (the shipped Azure traces) or the path of a CSV in the same format."""
    path = SHIPPED_TRACES.get(spec, Path(spec))
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            wanted = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
            if reader.fieldnames is None or not wanted.issubset(reader.fieldnames):
                raise TraceError(f"{path}: expected columns {sorted(wanted)}, got {reader.fieldnames}")
            for line, row in enumerate(reader, start=2):
                try:
                    times.append(datetime.fromisoformat(row["TIMESTAMP"]).timestamp())
                    prompts.append(max(1, int(row["ContextTokens"])))
                    outputs.append(max(1, int(row["GeneratedTokens"])))
                except ValueError as exc:
                    raise TraceError(f"{path}:{line}: {exc}") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace ({exc.strerror}); use conv, code or a CSV path") from None
    if not times:
        raise TraceError(f"{path}: no requests")
    order = np.argsort(np.asarray(times), kind="stable")
    offsets = np.asarray(times)[order]
    return Trace(
        name=spec if spec in SHIPPED_TRACES else path.stem,
        offsets_s=offsets - offsets[0],
        prompt_tokens=np.asarray(prompts, dtype=np.int64)[order],
        output_tokens=np.asarray(outputs, dtype=np.int64)[order],
    )


@dataclass(frozen=True)
class City:
    name: str
    lat: float
    lon: float


@dataclass(frozen=True)
class Continent:
    """Clients of one continent: its share of requests, where they sit, and the jurisdiction
    a residency requirement keeps their requests in (None: no residency rule there)."""

    name: str
    share: float
    cities: tuple[City, ...]
    jurisdiction: str | None = None


# Shares of world population in 2023 (UN World Population Prospects), a few large cities each.
DEFAULT_CONTINENTS: tuple[Continent, ...] = (
    Continent("asia", 0.592, (
        City("tokyo", 35.68, 139.69), City("delhi", 28.61, 77.21), City("shanghai", 31.23, 121.47),
        City("jakarta", -6.20, 106.85), City("mumbai", 19.08, 72.88), City("seoul", 37.57, 126.98),
        City("singapore", 1.35, 103.82), City("dubai", 25.20, 55.27),
    )),
    Continent("africa", 0.183, (
        City("lagos", 6.52, 3.38), City("cairo", 30.04, 31.24), City("nairobi", -1.29, 36.82),
        City("johannesburg", -26.20, 28.05),
    )),
    Continent("europe", 0.093, (
        City("paris", 48.86, 2.35), City("berlin", 52.52, 13.40), City("madrid", 40.42, -3.70),
        City("rome", 41.90, 12.50), City("warsaw", 52.23, 21.01), City("stockholm", 59.33, 18.07),
    ), jurisdiction="EU"),
    Continent("latin-america", 0.082, (
        City("sao-paulo", -23.55, -46.63), City("mexico-city", 19.43, -99.13),
        City("buenos-aires", -34.60, -58.38), City("bogota", 4.71, -74.07),
    )),
    Continent("north-america", 0.047, (
        City("new-york", 40.71, -74.01), City("chicago", 41.88, -87.63), City("los-angeles", 34.05, -118.24),
        City("toronto", 43.65, -79.38),
    )),
    Continent("oceania", 0.006, (City("sydney", -33.87, 151.21), City("melbourne", -37.81, 144.96))),
)


def with_shares(continents: tuple[Continent, ...], shares: dict[str, float]) -> tuple[Continent, ...]:
    """The continents with the given shares; continents not named get share 0."""
    known = {c.name for c in continents}
    unknown = sorted(set(shares) - known)
    if unknown:
        raise ValueError(f"unknown continent(s) {unknown} (known: {', '.join(sorted(known))})")
    return tuple(
        Continent(c.name, shares.get(c.name, 0.0), c.cities, c.jurisdiction) for c in continents
    )


@dataclass(frozen=True)
class WorkloadConfig:
    start: float
    hours: float
    # Mean arrival rate, requests/s; None: the trace's own rate.
    rate: float | None = None
    model: str = "llama-3.1-8b"
    continents: tuple[Continent, ...] = DEFAULT_CONTINENTS
    # Share of clients in a continent with a jurisdiction whose requests must stay in it.
    residency_share: float = 0.4
    batch_share: float = 0.0
    deferrable_share: float = 0.0
    # Deadline of a deferrable request after its arrival [s] (done by then); None: the
    # policy's deferrable TTFT SLO.
    deferrable_deadline_s: float | None = None
    # Share of requests that open with one of ``prefix_groups`` shared prefixes (system
    # prompts, few-shot headers), each ``prefix_tokens`` long (drawn per group).
    prefix_share: float = 0.3
    prefix_groups: int = 64
    prefix_tokens: tuple[int, int] = (256, 2048)

    def __post_init__(self) -> None:
        if self.hours <= 0:
            raise ValueError(f"hours must be positive, got {self.hours}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        for name in ("residency_share", "batch_share", "deferrable_share", "prefix_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.deferrable_deadline_s is not None and not self.deferrable_deadline_s > 0:
            raise ValueError(f"deferrable deadline must be positive, got {self.deferrable_deadline_s}")
        if self.batch_share + self.deferrable_share > 1.0:
            raise ValueError("batch_share + deferrable_share must not exceed 1")
        if sum(c.share for c in self.continents) <= 0:
            raise ValueError("at least one continent needs a positive client share")


@dataclass(frozen=True)
class Workload:
    """Column-wise requests in arrival order (plain lists: the event loop indexes them)."""

    model: str
    arrival_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    city: list[int]
    restricted: list[bool]
    workload_class: list[int]  # index into WORKLOAD_CLASSES
    prefix_group: list[int]  # -1: no shared prefix
    prefix_tokens: list[int]
    cities: tuple[City, ...]
    # Per city: the jurisdiction a restricted request from there must stay in.
    city_jurisdiction: tuple[str | None, ...]
    # Deadline of a deferrable request after its arrival [s]; None: the policy's deferrable TTFT SLO.
    deferrable_deadline_s: float | None = None
    # The workflows the rows belong to (scheduler.sim.workflow; None: independent requests).
    # Then prefix_group is each row's workflow, prefix_tokens what it can reuse where its
    # workflow is warm, and a row that waits on others has arrival_s NaN (the engine times it).
    workflows: WorkflowColumns | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rows(self, start: int, stop: int) -> Workload:
        """Rows ``start`` to ``stop`` (exclusive) as a workload of their own (independent requests
        only: a workflow's steps refer to each other by row)."""
        if self.workflows is not None:
            raise ValueError("a workload of workflows cannot be cut into row ranges")
        cut = slice(start, stop)
        return dataclasses.replace(
            self, arrival_s=self.arrival_s[cut], prompt_tokens=self.prompt_tokens[cut],
            output_tokens=self.output_tokens[cut], city=self.city[cut], restricted=self.restricted[cut],
            workload_class=self.workload_class[cut], prefix_group=self.prefix_group[cut],
            prefix_tokens=self.prefix_tokens[cut])


def arrivals(trace: Trace, config: WorkloadConfig) -> tuple[np.ndarray, np.ndarray]:
    """The arrival times of the tiled, scaled trace (module docstring) and each one's trace row."""
    native = trace.native_rate
    rate = config.rate if config.rate is not None else native
    n_total = max(1, round(rate * config.hours * 3600.0))
    n = len(trace.offsets_s)
    index = np.arange(n_total)
    tile, row = index // n, index % n
    scale = native / rate
    return config.start + (tile * trace.span_s + trace.offsets_s[row]) * scale, row


@dataclass(frozen=True)
class Clients:
    """Per arrival: its client city, whether a residency rule binds it, its workload class."""

    cities: tuple[City, ...]
    city_jurisdiction: tuple[str | None, ...]
    city_of: np.ndarray
    restricted: np.ndarray
    classes: np.ndarray


def draw_clients(config: WorkloadConfig, n_total: int, rng: np.random.Generator) -> Clients:
    """Client cities by continent share, residency rules at ``residency_share`` of the clients
    in a jurisdiction, workload classes at their shares."""
    cities: list[City] = []
    city_jurisdiction: list[str | None] = []
    city_weight: list[float] = []
    total_share = sum(c.share for c in config.continents)
    for continent in config.continents:
        for city in continent.cities:
            cities.append(city)
            city_jurisdiction.append(continent.jurisdiction)
            city_weight.append(continent.share / total_share / len(continent.cities))
    city_of = rng.choice(len(cities), size=n_total, p=np.asarray(city_weight) / sum(city_weight))
    has_rule = np.asarray([j is not None for j in city_jurisdiction])[city_of]
    restricted = has_rule & (rng.random(n_total) < config.residency_share)

    u = rng.random(n_total)
    classes = np.full(n_total, WORKLOAD_CLASSES.index("interactive"), dtype=np.int64)
    classes[u < config.batch_share + config.deferrable_share] = WORKLOAD_CLASSES.index("batch")
    classes[u < config.deferrable_share] = WORKLOAD_CLASSES.index("deferrable")
    return Clients(tuple(cities), tuple(city_jurisdiction), city_of, restricted, classes)


def build_workload(trace: Trace, config: WorkloadConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    arrival, row = arrivals(trace, config)
    n_total = len(arrival)
    clients = draw_clients(config, n_total, rng)

    prompt = trace.prompt_tokens[row]
    groups = max(1, config.prefix_groups)
    popularity = 1.0 / np.arange(1, groups + 1)  # Zipf: a few system prompts dominate
    group = rng.choice(groups, size=n_total, p=popularity / popularity.sum())
    group[rng.random(n_total) >= config.prefix_share] = -1
    low, high = config.prefix_tokens
    group_tokens = rng.integers(low, high + 1, size=groups)
    prefix = np.where(group >= 0, np.minimum(group_tokens[group], prompt - 1), 0)
    group[prefix <= 0] = -1
    prefix[group < 0] = 0

    return Workload(
        model=config.model,
        arrival_s=arrival.tolist(),
        prompt_tokens=prompt.tolist(),
        output_tokens=trace.output_tokens[row].tolist(),
        city=clients.city_of.tolist(),
        restricted=clients.restricted.tolist(),
        workload_class=clients.classes.tolist(),
        prefix_group=group.tolist(),
        prefix_tokens=prefix.tolist(),
        cities=clients.cities,
        city_jurisdiction=clients.city_jurisdiction,
        deferrable_deadline_s=config.deferrable_deadline_s,
    )


# The requests are made by setting their slots (``scheduler.sim.slots``): one per arrival.
(_SET_REQUEST_ID, _SET_MODEL, _SET_PROMPT_TOKENS, _SET_MAX_TOKENS, _SET_TENANT, _SET_WORKLOAD_CLASS,
 _SET_TTFT_SLO_MS, _SET_TPOT_SLO_MS, _SET_ALLOWED_JURISDICTIONS, _SET_REQUIRED_CERTIFICATIONS, _SET_PRECISION,
 _SET_TASK_CLASS, _SET_CLIENT_LOCATION, _SET_PREFIX_KEY, _SET_CACHED_TOKENS, _SET_WORKFLOW_ID, _SET_WORKFLOW_SHAPE,
 _SET_SHARED_PREFIX_TOKENS) = slot_setters(Request)
_EMPTY: frozenset[str] = frozenset()


class RequestFactory:
    """Turns row i of a workload into a ``Request``, sharing the immutable parts (client
    locations, jurisdiction sets, prefix keys) between requests.

    A workflow's request carries its shape and shared prefix, its prefix key ``wf-<w>`` and,
    with ``workflow_ids``, its workflow id ``wf-<w>`` (without: the router cannot tell its
    workflows apart, the simulator's no-affinity baseline)."""

    __slots__ = ("_allowed", "_geo", "_ids", "_keys", "workload")

    def __init__(self, workload: Workload, workflow_ids: bool = True) -> None:
        self.workload = workload
        self._geo = tuple(GeoPoint(c.lat, c.lon) for c in workload.cities)
        self._allowed = tuple(frozenset({j}) if j else frozenset[str]() for j in workload.city_jurisdiction)
        groups = range(max(workload.prefix_group, default=-1) + 1)
        if workload.workflows is None:
            self._keys = tuple(f"prefix-{g}" for g in groups)
            self._ids: tuple[str, ...] = ()
        else:
            self._keys = tuple(f"wf-{g}" for g in groups)
            self._ids = self._keys if workflow_ids else ()

    def request(self, i: int) -> Request:
        """``Request(request_id=f"sim-{i}", model=..., ...)`` with the other fields at their
        defaults, made by setting its slots."""
        w = self.workload
        city = w.city[i]
        group = w.prefix_group[i]
        workload_class: WorkloadClass = WORKLOAD_CLASSES[w.workload_class[i]]
        flows = w.workflows
        shared = -1 if flows is None else flows.shared_prefix[i]
        request = object.__new__(Request)
        _SET_REQUEST_ID(request, f"sim-{i}")
        _SET_MODEL(request, w.model)
        _SET_PROMPT_TOKENS(request, w.prompt_tokens[i])
        _SET_MAX_TOKENS(request, w.output_tokens[i])
        _SET_TENANT(request, "")
        _SET_WORKLOAD_CLASS(request, workload_class)
        _SET_TTFT_SLO_MS(request, None)
        _SET_TPOT_SLO_MS(request, None)
        _SET_ALLOWED_JURISDICTIONS(request, self._allowed[city] if w.restricted[i] else _EMPTY)
        _SET_REQUIRED_CERTIFICATIONS(request, _EMPTY)
        _SET_PRECISION(request, None)
        _SET_TASK_CLASS(request, None)
        _SET_CLIENT_LOCATION(request, self._geo[city])
        _SET_PREFIX_KEY(request, self._keys[group] if group >= 0 else None)
        _SET_CACHED_TOKENS(request, 0)
        _SET_WORKFLOW_ID(request, self._ids[group] if self._ids else None)
        _SET_WORKFLOW_SHAPE(request, None if flows is None else flows.spec.shape)
        _SET_SHARED_PREFIX_TOKENS(request, None if shared < 0 else shared)
        return request
