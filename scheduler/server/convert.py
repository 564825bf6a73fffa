"""proto <-> ``scheduler.types``: the only module that knows both.

``incoming`` validates a ``GenerateRequest`` (every bad field is reported at once, by its
path) and turns it into the ``Request`` the scheduler decides on plus the ``RegionCall``
the dispatcher sends; the rest turn decisions, receipts and regions into messages.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from scheduler.energy.output_budget import OutputBudget
from scheduler.errors import FieldViolation, InvalidRequest
from scheduler.framework.explain import objective_of
from scheduler.server.dispatch import CHAT_COMPLETIONS, COMPLETIONS, RegionCall
from scheduler.server.prefix import derive_prefix_key, scoped, shared_text
from scheduler.tickets import ENGINE_FIELDS, MAX_TOKEN_BYTES, message_body
from scheduler.types import (
    CarbonUsed,
    Decision,
    FleetSnapshot,
    GeoPoint,
    Request,
    WorkflowShape,
    WorkloadClass,
)
from scheduler.v1 import messages_pb2 as pb

# The records' messages are shared with the SDK (scheduler.wire); the servicers use them from here.
from scheduler.wire.proto import carbon_to_proto, fallback_to_proto, output_budget_to_proto
from scheduler.wire.proto import receipt_to_proto as receipt_to_proto

MAX_TOKENS_LIMIT = 1_048_576
# A decision message lists at most this many ranked candidates and rejections (the totals say
# how many there were): every Generate stream carries one.
MAX_LISTED = 32
# Caps on what one request may carry (the gRPC message limit bounds the total; these keep
# each field to what a real request needs, so nothing is built per entry of a hostile list).
MAX_ID_CHARS = 128
MAX_NAME_CHARS = 64
MAX_PROMPT_BYTES = 4 * 2**20
MAX_CHAT_MESSAGES = 2048
MAX_LIST_ENTRIES = 32
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
# Without a tokenizer in the router: about 4 bytes of UTF-8 per token (English text).
BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
# The OpenAI body fields a GenerateRequest carries in fields of its own; ``engine_fields_json``
# may hold the rest of ``tickets.ENGINE_FIELDS`` (the one list of what an engine is given).
MESSAGE_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
                            "top_p", "stop", "seed", "n", "stream", "stream_options"})
ENGINE_JSON_FIELDS = ENGINE_FIELDS - MESSAGE_FIELDS
MAX_ENGINE_FIELDS_BYTES = 2**20
_JURISDICTION = re.compile(r"^[A-Z]{2,8}$")
_EMPTY: frozenset[str] = frozenset()
_WORKLOAD: dict[int, WorkloadClass] = {
    pb.WORKLOAD_CLASS_UNSPECIFIED: "interactive",
    pb.WORKLOAD_CLASS_INTERACTIVE: "interactive",
    pb.WORKLOAD_CLASS_BATCH: "batch",
    pb.WORKLOAD_CLASS_DEFERRABLE: "deferrable",
}
_WORKFLOW_SHAPE: dict[int, WorkflowShape | None] = {
    pb.WORKFLOW_SHAPE_UNSPECIFIED: None,
    pb.WORKFLOW_SHAPE_CHAIN: "chain",
    pb.WORKFLOW_SHAPE_FANOUT: "fanout",
    pb.WORKFLOW_SHAPE_DAG: "dag",
}


@dataclass(frozen=True)
class Incoming:
    request: Request
    call: RegionCall
    prompt_tokens_estimated: bool
    # How much of the decision the answer carries (pb.DecisionDetail; unspecified: full).
    decision_detail: int = pb.DECISION_DETAIL_FULL
    # The policy's output budget for the request (None: none applies); enforced, the request
    # and the call already carry its max_tokens.
    output_budget: OutputBudget | None = None
    # The router's own estimate of the prompt's tokens (from its bytes), whatever the client
    # declared: what a receipt bills when the region reports no usage.
    counted_prompt_tokens: int = 0


def with_max_tokens(incoming: Incoming, max_tokens: int) -> Incoming:
    """The request and its region call capped at ``max_tokens`` (an enforced output budget)."""
    return dataclasses.replace(
        incoming, request=dataclasses.replace(incoming.request, max_tokens=max_tokens),
        call=dataclasses.replace(incoming.call, body={**incoming.call.body, "max_tokens": max_tokens}))


def _estimate_tokens(text: str) -> int:
    return _tokens_of_bytes(len(text.encode()))


def _tokens_of_bytes(size: int) -> int:
    return max(1, math.ceil(size / BYTES_PER_TOKEN))


def show(value: str, limit: int = 40) -> str:
    """A value quoted for an error message, clipped (never echo a hostile megabyte back)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value):,} characters)"


def _cap_strings(bad: list[FieldViolation], field: str, values: Any, max_entries: int, max_chars: int) -> bool:
    """One summarised violation when the list or one of its strings is too long; True if fine."""
    if len(values) > max_entries:
        bad.append(FieldViolation(field, f"at most {max_entries} entries, got {len(values):,}"))
        return False
    long = [i for i, value in enumerate(values) if len(value) > max_chars]
    if long:
        more = f" (and {len(long) - 1} more)" if len(long) > 1 else ""
        bad.append(FieldViolation(f"{field}[{long[0]}]", f"at most {max_chars} characters{more}"))
        return False
    return True


def _message_body(message: pb.ChatMessage, index: int, bad: list[FieldViolation]) -> dict[str, Any]:
    """A chat message with OpenAI's other fields (name, tool_call_id, tool_calls)."""
    calls = None
    if message.tool_calls_json:
        try:
            calls = orjson.loads(message.tool_calls_json)
        except orjson.JSONDecodeError:
            calls = None
        if type(calls) is not list:
            bad.append(FieldViolation(f"chat.messages[{index}].tool_calls_json",
                                      f"expected a JSON list, got {show(message.tool_calls_json)}"))
            calls = []
    return message_body(message.role, message.content, message.name, message.tool_call_id, calls)


def _engine_fields(raw: str, bad: list[FieldViolation]) -> dict[str, Any]:
    """``engine_fields_json`` as the object the region's body is extended with."""
    if len(raw) > MAX_ENGINE_FIELDS_BYTES:
        bad.append(FieldViolation("engine_fields_json", f"at most {MAX_ENGINE_FIELDS_BYTES:,} bytes, got {len(raw):,}"))
        return {}
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        bad.append(FieldViolation("engine_fields_json", f"not JSON: {exc}"[:200]))
        return {}
    if type(fields) is not dict:
        bad.append(FieldViolation("engine_fields_json", "expected a JSON object"))
        return {}
    for name in sorted(set(fields) - ENGINE_JSON_FIELDS):
        where = "a field of its own" if name in MESSAGE_FIELDS else "not passed to an engine"
        bad.append(FieldViolation(f"engine_fields_json.{name[:MAX_NAME_CHARS]}",
                                  f"{where} (allowed: {', '.join(sorted(ENGINE_JSON_FIELDS))})"))
    return fields


def incoming(msg: pb.GenerateRequest, tenant: str, snapshot: FleetSnapshot) -> Incoming:
    """Validate and convert; ``InvalidRequest`` lists every bad field. ``tenant`` is the caller's."""
    bad: list[FieldViolation] = []
    served = snapshot.candidates_by_model
    model = msg.model
    if not model:
        bad.append(FieldViolation("model", "required"))
    elif model not in served:
        bad.append(FieldViolation("model", f"unknown model {show(model)} (served: {', '.join(sorted(served))})"))
    # Each field read once: every read of a proto field is a lookup by name (and a new str).
    request_id, prefix_key, workflow_id = msg.request_id, msg.prefix_key, msg.workflow_id
    for name, value, limit in (("request_id", request_id, MAX_ID_CHARS), ("tenant", msg.tenant, MAX_ID_CHARS),
                               ("prefix_key", prefix_key, MAX_ID_CHARS * 2), ("workflow_id", workflow_id, MAX_ID_CHARS)):
        if len(value) > limit:
            bad.append(FieldViolation(name, f"at most {limit} characters, got {len(value):,}"))

    body: dict[str, Any]
    input_kind = msg.WhichOneof("input")
    prompt_bytes = 0
    if input_kind == "prompt":
        prompt = msg.prompt
        if not prompt:
            bad.append(FieldViolation("prompt", "must not be empty"))
        prompt_bytes = len(prompt.encode())
        body, path, text_tokens = {"prompt": prompt}, COMPLETIONS, _tokens_of_bytes(prompt_bytes)
    elif input_kind == "chat":
        messages = list(msg.chat.messages)
        if not messages:
            bad.append(FieldViolation("chat.messages", "at least one message is required"))
        if len(messages) > MAX_CHAT_MESSAGES:
            bad.append(FieldViolation("chat.messages", f"at most {MAX_CHAT_MESSAGES} messages, got {len(messages):,}"))
            messages = []
        wrong = [i for i, message in enumerate(messages) if message.role not in CHAT_ROLES]
        if wrong:
            more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
            bad.append(FieldViolation(f"chat.messages[{wrong[0]}].role",
                                      f"expected one of {sorted(CHAT_ROLES)}, got {show(messages[wrong[0]].role)}{more}"))
        body = {"messages": [_message_body(m, i, bad) if m.name or m.tool_call_id or m.tool_calls_json
                             else {"role": m.role, "content": m.content} for i, m in enumerate(messages)]}
        path = CHAT_COMPLETIONS
        prompt_bytes = sum(len(m.role.encode()) + len(m.content.encode()) + len(m.tool_calls_json.encode())
                           for m in messages)
        text_tokens = sum(_estimate_tokens(m.content) + CHAT_TOKENS_PER_MESSAGE for m in messages)
    else:
        bad.append(FieldViolation("input", "one of prompt or chat is required"))
        body, path, text_tokens = {}, COMPLETIONS, 0
    if prompt_bytes > MAX_PROMPT_BYTES:
        bad.append(FieldViolation(input_kind or "input", f"at most {MAX_PROMPT_BYTES:,} bytes, got {prompt_bytes:,}"))

    sampling = msg.sampling
    max_tokens = sampling.max_tokens
    if not 0 < max_tokens <= MAX_TOKENS_LIMIT:
        bad.append(FieldViolation("sampling.max_tokens", f"must be in 1..{MAX_TOKENS_LIMIT}, got {max_tokens}"))
    body["max_tokens"] = max_tokens
    if sampling.HasField("temperature"):
        if not 0.0 <= sampling.temperature <= 2.0:
            bad.append(FieldViolation("sampling.temperature", f"must be in [0, 2], got {sampling.temperature:g}"))
        body["temperature"] = sampling.temperature
    if sampling.HasField("top_p"):
        if not 0.0 < sampling.top_p <= 1.0:
            bad.append(FieldViolation("sampling.top_p", f"must be in (0, 1], got {sampling.top_p:g}"))
        body["top_p"] = sampling.top_p
    if sampling.stop and _cap_strings(bad, "sampling.stop", sampling.stop, MAX_STOP_SEQUENCES, MAX_STOP_CHARS):
        body["stop"] = list(sampling.stop)
    if sampling.HasField("seed"):
        body["seed"] = sampling.seed
    if msg.engine_fields_json:
        engine_fields = _engine_fields(msg.engine_fields_json, bad)
        body.update(engine_fields)
        # Tool definitions are rendered into the prompt by the chat template.
        if "tools" in engine_fields:
            text_tokens += _tokens_of_bytes(len(orjson.dumps(engine_fields["tools"])))

    slo = msg.slo
    ttft_slo_ms = slo.ttft_ms if slo.HasField("ttft_ms") else None
    tpot_slo_ms = slo.tpot_ms if slo.HasField("tpot_ms") else None
    for name, target in (("ttft_ms", ttft_slo_ms), ("tpot_ms", tpot_slo_ms)):
        if target is not None and not target > 0:
            bad.append(FieldViolation(f"slo.{name}", f"must be positive, got {target:g}"))
    workload_class, workflow_shape = msg.workload_class, msg.workflow_shape
    if workload_class not in _WORKLOAD:
        bad.append(FieldViolation("workload_class", f"unknown value {workload_class}"))
    if workflow_shape not in _WORKFLOW_SHAPE:
        bad.append(FieldViolation("workflow_shape", f"unknown value {workflow_shape}"))
    elif workflow_shape and not workflow_id:
        # A shape without a workflow has no siblings or steps to relate to.
        bad.append(FieldViolation("workflow_shape", "needs a workflow_id"))
    compliance = msg.compliance
    jurisdictions, certifications = compliance.allowed_jurisdictions, compliance.required_certifications
    if jurisdictions and _cap_strings(bad, "compliance.allowed_jurisdictions", jurisdictions, MAX_LIST_ENTRIES, 8):
        wrong = [i for i, code in enumerate(jurisdictions) if not _JURISDICTION.match(code)]
        if wrong:
            more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
            bad.append(FieldViolation(f"compliance.allowed_jurisdictions[{wrong[0]}]",
                                      f"expected an upper-case code like 'EU', got "
                                      f"{show(jurisdictions[wrong[0]])}{more}"))
    if certifications:
        _cap_strings(bad, "compliance.required_certifications", certifications, MAX_LIST_ENTRIES, MAX_NAME_CHARS)
    precision, task_class = compliance.precision, compliance.task_class
    for name, value in (("precision", precision), ("task_class", task_class)):
        if len(value) > MAX_NAME_CHARS:
            bad.append(FieldViolation(f"compliance.{name}", f"at most {MAX_NAME_CHARS} characters"))
    location = None
    if msg.HasField("client_location"):
        lat, lon = msg.client_location.lat, msg.client_location.lon
        if not (-90 <= lat <= 90 and -180 <= lon <= 180):
            bad.append(FieldViolation("client_location", f"({lat:g}, {lon:g}) is not a point on Earth"))
        location = GeoPoint(lat, lon)

    estimated = not msg.HasField("prompt_tokens")
    prompt_tokens = text_tokens if estimated else msg.prompt_tokens
    if not estimated and prompt_tokens <= 0:
        bad.append(FieldViolation("prompt_tokens", "must be positive when given"))
    # No tokenizer here, but no token is longer than MAX_TOKEN_BYTES: a declared count below
    # ceil(bytes / MAX_TOKEN_BYTES) is impossible (and would dodge the context and energy checks).
    if not estimated and 0 < prompt_tokens < (least := math.ceil(prompt_bytes / MAX_TOKEN_BYTES)):
        bad.append(FieldViolation("prompt_tokens", f"{prompt_tokens:,} is fewer than a {prompt_bytes:,}-byte prompt "
                                                   f"can hold (at least {least:,})"))
    cached = msg.cached_tokens if msg.HasField("cached_tokens") else 0
    if cached > prompt_tokens:
        bad.append(FieldViolation("cached_tokens", f"{cached} exceeds the prompt's {prompt_tokens} tokens"))
    shared = msg.shared_prefix_tokens if msg.HasField("shared_prefix_tokens") else None
    if shared is not None and shared > prompt_tokens:
        bad.append(FieldViolation("shared_prefix_tokens", f"{shared} exceeds the prompt's {prompt_tokens} tokens"))
    if bad:
        raise InvalidRequest(bad)

    request = Request(
        request_id=request_id or os.urandom(16).hex(),
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        tenant=tenant,
        workload_class=_WORKLOAD[workload_class],
        ttft_slo_ms=ttft_slo_ms,
        tpot_slo_ms=tpot_slo_ms,
        allowed_jurisdictions=frozenset(jurisdictions) if jurisdictions else _EMPTY,
        required_certifications=frozenset(certifications) if certifications else _EMPTY,
        precision=precision or None,
        task_class=task_class or None,
        client_location=location,
        # Without a key, one hashed from the system prompt's (or prompt's) first K tokens;
        # keys and workflows are the tenant's own (scheduler.server.prefix).
        prefix_key=scoped(tenant, prefix_key) if prefix_key else derive_prefix_key(
            shared_text(body), snapshot.policy.prefix_key_tokens, BYTES_PER_TOKEN, tenant),
        cached_tokens=cached,
        workflow_id=scoped(tenant, workflow_id) if workflow_id else None,
        workflow_shape=_WORKFLOW_SHAPE.get(workflow_shape),
        shared_prefix_tokens=shared,
    )
    detail = pb.DECISION_DETAIL_SUMMARY if msg.decision_detail == pb.DECISION_DETAIL_SUMMARY else pb.DECISION_DETAIL_FULL
    return Incoming(request, RegionCall(path, body), estimated, detail, counted_prompt_tokens=text_tokens)


@functools.lru_cache(maxsize=256)
def _objective_frame(policy: str, names: tuple[str, ...], units: tuple[str, ...], rates: tuple[float, ...],
                     written: tuple[str, ...]) -> bytes:
    """The fields of a Decision message that one policy's objective fixes (its rates, units and
    text), serialised once per objective: every decision under it starts from these bytes."""
    return pb.Decision(policy=policy, rates=dict(zip(names, rates, strict=True)),
                       units=dict(zip(names, units, strict=True)),
                       objective=objective_of(names, units, written)).SerializeToString()


@functools.lru_cache(maxsize=4096)
def _candidate_frame(region: str, pool: str, model: str, gpu: str, endpoint: str, precision: str,
                     tickets_enforced: bool) -> bytes:
    """A ranked candidate's fixed fields, serialised once per candidate."""
    return pb.RankedCandidate(region=region, pool=pool, model=model, gpu=gpu, endpoint=endpoint,
                              precision=precision, tickets_enforced=tickets_enforced).SerializeToString()


def decision_to_proto(decision: Decision, decision_id: str, incoming_: Incoming,
                      config_version: str = "") -> pb.Decision:
    """The decision as the request asked for it (``incoming_.decision_detail``): in full, every
    ranked candidate and rejection up to ``MAX_LISTED``; as a summary, the chosen one.
    ``config_version``: that of the snapshot it was decided on (``FleetSnapshot.config_version``)."""
    message = pb.Decision()
    fill_decision(message, decision, decision_id, incoming_, config_version)
    return message


def fill_decision(message: pb.Decision, decision: Decision, decision_id: str, incoming_: Incoming,
                  config_version: str = "") -> None:
    """``decision_to_proto`` into an empty message (a response's field: no copy)."""
    full = incoming_.decision_detail != pb.DECISION_DETAIL_SUMMARY
    names, rates = decision.scorer_names, decision.rates
    message.MergeFromString(_objective_frame(decision.policy, names, decision.units, rates, decision.rates_written))
    n_ranked = len(decision.order)
    shown = min(n_ranked if full else min(1, n_ranked), MAX_LISTED)
    if shown:
        # One conversion of the survivors' quantities and totals to Python floats, in rank order
        # (per-element numpy indexing costs more than the whole message otherwise).
        order = np.asarray(decision.order[:shown]).tolist()
        totals = np.asarray(decision.totals, dtype=np.float64).tolist()
        by_survivor = np.asarray(decision.quantities, dtype=np.float64).reshape(len(names), len(totals)).T.tolist()
        fleet, index = decision.fleet, decision.survivor_index
        ranked = message.ranked
        for k, i in enumerate(order):
            c = fleet[index[i]]
            pool = c.pool
            item = ranked.add()
            item.MergeFromString(_candidate_frame(c.region.name, pool.name, c.deployment.name, pool.gpu,
                                                  c.region.endpoint, c.deployment.precision,
                                                  c.region.tickets_enforced))
            item.total = totals[i]
            # Item assignment: several times cheaper than passing dicts to the constructor.
            quantities, costs = item.quantities, item.costs
            for name, rate, value in zip(names, rates, by_survivor[i], strict=True):
                quantities[name] = value
                costs[name] = rate * value
            if k == 0:
                e = decision.energy
                if e is not None:
                    energy = item.energy
                    energy.energy_j, energy.energy_j_low, energy.energy_j_high = e.energy_j, e.low_j, e.high_j
                    energy.prefill_j, energy.decode_j, energy.idle_j = e.prefill_j, e.decode_j, e.idle_j
                    energy.provenance = e.provenance
    message.decision_id = decision_id
    message.request_id = decision.request_id
    message.decided_at_unix_s = decision.decided_at
    if decision.fallbacks:
        message.fallbacks.extend(fallback_to_proto(f) for f in decision.fallbacks)
    message.energy_ranking = decision.energy_ranking
    message.prompt_tokens = incoming_.request.prompt_tokens
    message.prompt_tokens_estimated = incoming_.prompt_tokens_estimated
    message.ranked_total = n_ranked
    message.rejected_total = decision.rejected_count
    message.canary_arm = decision.canary_arm
    message.config_version = config_version
    if incoming_.output_budget is not None:
        message.output_budget.CopyFrom(output_budget_to_proto(incoming_.output_budget))
    if full:
        rejected = decision.rejected
        message.rejected.extend(
            pb.Rejection(region=r.candidate.region.name, pool=r.candidate.pool.name, plugin=r.plugin, reason=r.reason)
            for r in rejected[:MAX_LISTED])
        timings = message.plugin_timings_ns
        for name, ns in decision.plugin_timings_ns.items():
            timings[name] = ns


def deferred_decision(message: pb.Decision, until: float, deferral: str) -> pb.Decision:
    """``message`` marked as held by the deferral queue until ``until`` (epoch s); ``deferral``:
    "<reason>: <explanation>" (docs/deferral.md)."""
    message.deferred_until_unix_s = until
    message.deferral = deferral
    return message


def regions_to_proto(snapshot: FleetSnapshot) -> list[pb.RegionInfo]:
    infos = []
    for region in snapshot.regions:
        live = snapshot.live.get(region.name)
        info = pb.RegionInfo(
            name=region.name, jurisdiction=region.jurisdiction, certifications=list(region.certifications),
            grid_zone=region.grid_zone, pue=region.pue, endpoint=region.endpoint, kind=region.kind,
            location=pb.GeoPoint(lat=region.location.lat, lon=region.location.lon),
            pools=[pb.PoolInfo(name=p.name, gpu=p.gpu, count=p.count, models=[m.name for m in p.models])
                   for p in region.pools],
            healthy=(fresh := snapshot.fresh_live(region.name)) is not None and fresh.healthy,
        )
        if live is not None:
            info.state_age_s = snapshot.age(live.observed_at)
        signal = snapshot.carbon.get(region.grid_zone)
        if signal is not None:
            age = snapshot.age(signal.observed_at)
            info.carbon.CopyFrom(carbon_to_proto(CarbonUsed(signal, age, age > snapshot.policy.max_age.carbon)))
        infos.append(info)
    return infos
