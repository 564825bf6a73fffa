"""The OpenAI-compatible front door's formats: an OpenAI request in, our ``GenerateRequest``;
our stream out, OpenAI's chunks and completion objects, plus the energy receipt.

Requests (``POST /v1/completions``, ``POST /v1/chat/completions``), per OpenAI's API reference.
A field that is null, or has OpenAI's default value (``presence_penalty: 0``, ``logprobs:
false``, ``n: 1``, ``parallel_tool_calls: true`` ...), is as if absent. The rest:

- read by the router: ``model``, ``prompt`` (a string) or ``messages`` (``role``, ``content``
  as a string or ``{"type": "text"}`` parts, ``name``, ``tool_call_id``, ``tool_calls``),
  ``max_tokens`` (chat also ``max_completion_tokens``; absent: 16 for completions, OpenAI's
  default; for chat up to the model's context, at most the policy's
  ``chat_default_max_tokens``), ``temperature``, ``top_p``, ``stop``, ``seed``, ``stream``,
  ``stream_options.include_usage``;
- passed to the engine as they are, through the dispatch ticket's allowlist
  (``tickets.ENGINE_FIELDS``, the one list): ``CHAT_ENGINE_FIELDS`` / ``COMPLETION_ENGINE_FIELDS``
  (tools, tool_choice, response_format, logprobs, top_logprobs, penalties, top_k ...);
- accepted, without effect on the answer, not passed on: ``NO_EFFECT_FIELDS`` (``user``,
  ``metadata``, ``store``: nothing is stored ...);
- anything else, and a non-default ``n``, ``best_of`` or ``modalities``, would change the answer
  and cannot be honoured: refused with a 400 naming the field and its value, never dropped.

Scheduling hints, in the body's ``x_scheduler`` object (the openai client's ``extra_body``) or
as ``x-scheduler-<name>`` headers (``extra_headers``; the body wins): ``tenant``,
``request_id``, ``workload_class``, ``ttft_ms``, ``tpot_ms``, ``deadline_ms``,
``jurisdictions``, ``certifications`` (lists; comma-separated in a header), ``precision``,
``task_class``, ``client_location`` (``[lat, lon]`` or ``{"lat", "lon"}``; ``"lat,lon"`` in a
header), ``prefix_key``, ``workflow_id``, ``workflow_shape`` (chain, fanout, dag),
``shared_prefix_tokens``, ``prompt_tokens``, ``cached_tokens``.

Answers: streamed, OpenAI's ``text_completion`` / ``chat.completion.chunk`` events (with the
engine's tool calls, reasoning and logprobs), and with ``stream_options.include_usage`` a usage
chunk (``choices: []``) whose ``usage`` carries ``prompt_tokens_details.cached_tokens`` and the
receipt (``usage.energy_receipt``: OpenAI's clients keep unknown fields of ``usage``), then
``data: [DONE]``. Without ``include_usage``, and after an error event, the receipt follows
``[DONE]`` as one ``event: energy_receipt`` event (curl sees it; OpenAI's clients stop reading at
``[DONE]``). Not streamed: OpenAI's completion object with the receipt in an extra
``energy_receipt`` field and ``x-energy-*`` headers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from scheduler.errors import FieldViolation, InvalidRequest
from scheduler.server.convert import BYTES_PER_TOKEN, CHAT_TOKENS_PER_MESSAGE, ENGINE_JSON_FIELDS
from scheduler.server.dispatch import TextDelta
from scheduler.tickets import MESSAGE_KEYS
from scheduler.types import EnergyReceipt, FleetSnapshot
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2

DEFAULT_COMPLETION_MAX_TOKENS = 16
WORKLOAD = {"interactive": pb.WORKLOAD_CLASS_INTERACTIVE, "batch": pb.WORKLOAD_CLASS_BATCH,
            "deferrable": pb.WORKLOAD_CLASS_DEFERRABLE}
WORKFLOW_SHAPE = {"chain": pb.WORKFLOW_SHAPE_CHAIN, "fanout": pb.WORKFLOW_SHAPE_FANOUT, "dag": pb.WORKFLOW_SHAPE_DAG}
# The fields the router reads itself (into the GenerateRequest's own fields).
COMPLETION_FIELDS = frozenset({"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "stream",
                               "stream_options", "x_scheduler"})
CHAT_FIELDS = (COMPLETION_FIELDS - {"prompt"}) | {"messages", "max_completion_tokens"}
# Engine fields one endpoint's engine reads and the other's ignores: refused on the other.
CHAT_ONLY_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "reasoning_effort",
                              "chat_template_kwargs"})
COMPLETION_ONLY_FIELDS = frozenset({"echo"})
# Accepted and not passed on: they do not change the answer (``store``: this router stores
# no completions; ``service_tier``: every request is served the same).
NO_EFFECT_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
# Passed to the engine as they are (GenerateRequest.engine_fields_json).
CHAT_ENGINE_FIELDS = ENGINE_JSON_FIELDS - COMPLETION_ONLY_FIELDS - NO_EFFECT_FIELDS
COMPLETION_ENGINE_FIELDS = ENGINE_JSON_FIELDS - CHAT_ONLY_FIELDS - NO_EFFECT_FIELDS
# OpenAI's defaults: a field with one of these values (of the same JSON type) is as if absent.
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False,), "top_logprobs": (0,),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "parallel_tool_calls": (True,),
    "logit_bias": ({},), "tools": ([],), "stop": ([],), "modalities": (["text"],), "store": (False,),
}
# Fields honoured at their default only (anything else would change the answer).
DEFAULT_ONLY_FIELDS = frozenset({"n", "best_of", "modalities"})
# Engine fields whose answer is more than text (tool calls, logprobs): only a streamed or whole
# OpenAI answer carries it, not a deferred request's stored text.
BEYOND_TEXT_FIELDS = frozenset({"tools", "tool_choice", "logprobs", "top_logprobs"})
HINTS = frozenset({"tenant", "request_id", "workload_class", "ttft_ms", "tpot_ms", "deadline_ms", "jurisdictions",
                   "certifications", "precision", "task_class", "client_location", "prefix_key", "prompt_tokens",
                   "cached_tokens", "workflow_id", "workflow_shape", "shared_prefix_tokens"})
HINT_HEADER = "x-scheduler-"


@dataclass(frozen=True)
class OpenAiCall:
    """What the request asked beyond the ``GenerateRequest``."""

    chat: bool
    model: str
    stream: bool
    include_usage: bool
    # The client's deadline from now (``deadline_ms``), None: none.
    remaining_s: float | None


class _Fields:
    """Collects the violations of one request, each named by its path."""

    def __init__(self) -> None:
        self.bad: list[FieldViolation] = []

    def fail(self, field: str, description: str) -> None:
        self.bad.append(FieldViolation(field, description))

    def string(self, field: str, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        self.fail(field, f"expected a string, got {type(value).__name__}")
        return None

    def number(self, field: str, value: Any) -> float | None:
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            return None if value is None else float(value)
        self.fail(field, f"expected a number, got {type(value).__name__}")
        return None

    def integer(self, field: str, value: Any, least: int = 0) -> int | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            self.fail(field, f"expected an integer >= {least}, got {_show(value)}")
            return None
        return value

    def strings(self, field: str, value: Any) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        self.fail(field, "expected a list of strings")
        return []


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _hints(body: Mapping[str, Any], headers: Mapping[str, str], fields: _Fields) -> dict[str, Any]:
    """The scheduling hints: the body's ``x_scheduler`` over the ``x-scheduler-*`` headers."""
    raw = body.get("x_scheduler")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        fields.fail("x_scheduler", "expected an object")
        raw = {}
    unknown = sorted(set(raw) - set(HINTS))
    if unknown:
        fields.fail(f"x_scheduler.{unknown[0]}", f"unknown hint (known: {', '.join(sorted(HINTS))})")
    hints: dict[str, Any] = {}
    for header, text in headers.items():
        if header.startswith(HINT_HEADER):
            name = header[len(HINT_HEADER):].replace("-", "_")
            if name in HINTS:
                hints[name] = _header_value(name, text, fields)
    hints.update({k: v for k, v in raw.items() if k in HINTS})
    return hints


def _header_value(name: str, text: str, fields: _Fields) -> Any:
    if name in ("ttft_ms", "tpot_ms", "deadline_ms"):
        try:
            return float(text)
        except ValueError:
            fields.fail(f"{HINT_HEADER}{name.replace('_', '-')}", f"expected a number, got {_show(text)}")
            return None
    if name in ("prompt_tokens", "cached_tokens", "shared_prefix_tokens"):
        return int(text) if text.isdigit() else text
    if name == "client_location":
        parts = text.split(",")
        try:
            return [float(parts[0]), float(parts[1])] if len(parts) == 2 else text
        except ValueError:
            return text
    return text


def _messages(value: Any, fields: _Fields) -> list[pb.ChatMessage]:
    if not isinstance(value, list) or not value:
        fields.fail("messages", "expected a non-empty list of messages")
        return []
    out = []
    for i, raw in enumerate(value):
        if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
            fields.fail(f"messages[{i}]", "expected an object with a string 'role'")
            return []
        message = {key: item for key, item in raw.items() if item is not None}
        extra = sorted(set(message) - MESSAGE_KEYS)
        if extra:
            fields.fail(f"messages[{i}].{extra[0]}", f"not supported by this router (a message has: "
                                                    f"{', '.join(sorted(MESSAGE_KEYS))})")
            return []
        tool_calls = message.get("tool_calls")
        content = message.get("content", "" if tool_calls else None)
        if isinstance(content, list):
            texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
            strings = [t for t in texts if isinstance(t, str)]
            if len(strings) != len(content):
                fields.fail(f"messages[{i}].content", "only text content is supported (parts of type 'text')")
                return []
            content = "".join(strings)
        if not isinstance(content, str):
            fields.fail(f"messages[{i}].content", "expected a string or a list of text parts")
            return []
        chat_message = pb.ChatMessage(role=message["role"], content=content)
        for key in ("name", "tool_call_id"):
            text = fields.string(f"messages[{i}].{key}", message.get(key))
            if text:
                setattr(chat_message, key, text)
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                fields.fail(f"messages[{i}].tool_calls", "expected a list of tool calls")
                return []
            chat_message.tool_calls_json = orjson.dumps(tool_calls).decode()
        out.append(chat_message)
    return out


def _engine_fields(body: Mapping[str, Any], chat: bool, fields: _Fields) -> dict[str, Any]:
    """The body's fields passed to the engine; the others that are not the router's own are
    refused by name (a default-valued one is as if absent)."""
    own, passed = (CHAT_FIELDS, CHAT_ENGINE_FIELDS) if chat else (COMPLETION_FIELDS, COMPLETION_ENGINE_FIELDS)
    engine: dict[str, Any] = {}
    for name, value in body.items():
        if name in own or name in NO_EFFECT_FIELDS or _is_default(name, value):
            continue
        if name in passed:
            engine[name] = value
        elif name in DEFAULT_ONLY_FIELDS:
            allowed = " or ".join(orjson.dumps(d).decode() for d in DEFAULTS[name])
            fields.fail(name, f"only {name}={allowed} is supported, got {_show(value)}")
        else:
            where = "chat completions only" if name in CHAT_ONLY_FIELDS else \
                "completions only" if name in COMPLETION_ONLY_FIELDS else "not supported by this router"
            fields.fail(name, f"{name}={_show(value)}: {where} (it would change the answer and cannot be "
                              "honoured here, so it is refused rather than dropped)")
    return engine


def _is_default(name: str, value: Any) -> bool:
    return value is None or any(type(value) is type(default) and value == default
                                for default in DEFAULTS.get(name, ()))


def _apply_hints(msg: pb.GenerateRequest, hints: Mapping[str, Any], fields: _Fields) -> float | None:
    """The scheduling hints into ``msg``; the client's deadline in ms (None: none)."""
    msg.tenant = fields.string("x_scheduler.tenant", hints.get("tenant")) or ""
    msg.request_id = fields.string("x_scheduler.request_id", hints.get("request_id")) or ""
    workload = hints.get("workload_class", "interactive")
    if workload not in WORKLOAD:
        fields.fail("x_scheduler.workload_class", f"expected one of {sorted(WORKLOAD)}, got {_show(workload)}")
    else:
        msg.workload_class = WORKLOAD[workload]
    for name in ("ttft_ms", "tpot_ms"):
        value = fields.number(f"x_scheduler.{name}", hints.get(name))
        if value is not None:
            setattr(msg.slo, name, value)
    msg.compliance.allowed_jurisdictions.extend(fields.strings("x_scheduler.jurisdictions", hints.get("jurisdictions")))
    msg.compliance.required_certifications.extend(
        fields.strings("x_scheduler.certifications", hints.get("certifications")))
    msg.compliance.precision = fields.string("x_scheduler.precision", hints.get("precision")) or ""
    msg.compliance.task_class = fields.string("x_scheduler.task_class", hints.get("task_class")) or ""
    msg.prefix_key = fields.string("x_scheduler.prefix_key", hints.get("prefix_key")) or ""
    msg.workflow_id = fields.string("x_scheduler.workflow_id", hints.get("workflow_id")) or ""
    shape = fields.string("x_scheduler.workflow_shape", hints.get("workflow_shape"))
    if shape is not None and shape not in WORKFLOW_SHAPE:
        fields.fail("x_scheduler.workflow_shape", f"expected one of {sorted(WORKFLOW_SHAPE)}, got {_show(shape)}")
    elif shape is not None:
        msg.workflow_shape = WORKFLOW_SHAPE[shape]
    location = hints.get("client_location")
    if isinstance(location, dict):
        location = [location.get("lat"), location.get("lon")]
    if location is not None:
        if (isinstance(location, list) and len(location) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in location)):
            msg.client_location.lat, msg.client_location.lon = float(location[0]), float(location[1])
        else:
            fields.fail("x_scheduler.client_location", "expected [lat, lon]")
    for name in ("prompt_tokens", "cached_tokens", "shared_prefix_tokens"):
        value = fields.integer(f"x_scheduler.{name}", hints.get(name))
        if value is not None:
            setattr(msg, name, value)
    deadline_ms = fields.number("x_scheduler.deadline_ms", hints.get("deadline_ms"))
    if deadline_ms is not None and deadline_ms <= 0:
        fields.fail("x_scheduler.deadline_ms", f"must be positive, got {deadline_ms:g}")
    return deadline_ms


def generate_request(body: Any, headers: Mapping[str, str], chat: bool) -> tuple[pb.GenerateRequest, OpenAiCall]:
    """The request the router decides on; ``InvalidRequest`` names every bad field. A chat
    request without max_tokens leaves ``sampling.max_tokens`` 0, for ``fill_chat_max_tokens``."""
    if not isinstance(body, dict):
        raise InvalidRequest([FieldViolation("body", "expected a JSON object")])
    fields = _Fields()
    model = fields.string("model", body.get("model")) or ""
    if not model:
        fields.fail("model", "required")
    msg = pb.GenerateRequest(model=model, workload_class=WORKLOAD["interactive"])
    if chat:
        msg.chat.messages.extend(_messages(body.get("messages"), fields))
        limit = body.get("max_completion_tokens")
        if limit is None:
            limit = body.get("max_tokens")
        max_tokens = fields.integer("max_tokens", limit, least=1)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            fields.fail("prompt", "expected a string (one prompt; token-id prompts are not supported)")
            prompt = ""
        msg.prompt = prompt
        limit = body.get("max_tokens")
        max_tokens = fields.integer("max_tokens", limit, least=1)
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if limit is None else max_tokens
    msg.sampling.max_tokens = max_tokens or 0
    for name in ("temperature", "top_p"):
        value = fields.number(name, body.get(name))
        if value is not None:
            setattr(msg.sampling, name, value)
    seed = fields.integer("seed", body.get("seed"))
    if seed is not None:
        msg.sampling.seed = seed
    stop = body.get("stop")
    if stop is not None:
        msg.sampling.stop.extend([stop] if isinstance(stop, str) else fields.strings("stop", stop))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        fields.fail("stream", "expected true or false")
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    engine = _engine_fields(body, chat, fields)
    if engine:
        msg.engine_fields_json = orjson.dumps(engine).decode()

    hints = _hints(body, headers, fields)
    # Most requests carry no hints: none of their checks to run.
    deadline_ms = _apply_hints(msg, hints, fields) if hints else None
    if fields.bad:
        raise InvalidRequest(fields.bad)
    return msg, OpenAiCall(chat, model, stream is True, include_usage,
                           None if deadline_ms is None else deadline_ms / 1000.0)


def deferred_request(body: Any, headers: Mapping[str, str], chat: bool = False) -> router_pb2.DeferRequest:
    """A deferred body (a completions or chat completions body plus ``deadline``, epoch seconds,
    0 or absent: the policy's deferrable SLO from now) as a ``DeferRequest``; the workload class
    is ``deferrable`` unless the request names one. Refused: ``stream`` (a deferred request is
    fetched) and the fields whose answer is more than the text it keeps (``BEYOND_TEXT_FIELDS``)."""
    if not isinstance(body, dict):
        raise InvalidRequest([FieldViolation("body", "expected a JSON object")])
    bad = []
    deadline = body.get("deadline", 0)
    if not isinstance(deadline, int | float) or isinstance(deadline, bool) or not math.isfinite(deadline):
        bad.append(FieldViolation("deadline", f"expected epoch seconds, got {deadline!r}"[:200]))
        deadline = 0
    if body.get("stream", False) not in (False, None):
        bad.append(FieldViolation("stream", "a deferred request is fetched, not streamed"))
    completion = {name: value for name, value in body.items() if name != "deadline"}
    hints = completion.get("x_scheduler")
    try:
        msg, _ = generate_request(completion, headers, chat)
    except InvalidRequest as exc:
        raise InvalidRequest([*bad, *exc.violations]) from None
    beyond_text = sorted(set(orjson.loads(msg.engine_fields_json or "{}")) & BEYOND_TEXT_FIELDS)
    bad.extend(FieldViolation(name, f"{name}: a deferred answer is its text only (fetched later, without tool "
                                    "calls or logprobs)") for name in beyond_text)
    if bad:
        raise InvalidRequest(bad)
    named = (isinstance(hints, dict) and "workload_class" in hints) or "x-scheduler-workload-class" in headers
    if not named:
        msg.workload_class = pb.WORKLOAD_CLASS_DEFERRABLE
    return router_pb2.DeferRequest(request=msg, deadline_unix_s=float(deadline))


def max_model_len(snapshot: FleetSnapshot, model: str) -> int | None:
    """The longest sequence (prompt and output, in tokens) a pool of the fleet can run for the
    model: the largest KV capacity of one replica among its candidates (None: not served)."""
    candidates = snapshot.candidates_by_model.get(model)
    return max(c.kv_capacity_tokens for c in candidates) if candidates else None


def fill_chat_max_tokens(msg: pb.GenerateRequest, snapshot: FleetSnapshot) -> None:
    """A chat request without max_tokens: up to the model's context (as OpenAI and vLLM), less
    the prompt's estimated tokens, at most the policy's ``chat_default_max_tokens``."""
    if msg.sampling.max_tokens or msg.WhichOneof("input") != "chat":
        return
    cap = snapshot.policy.chat_default_max_tokens
    context = max_model_len(snapshot, msg.model)
    if context is None:
        msg.sampling.max_tokens = cap  # an unknown model: the decision refuses it by name
        return
    messages = msg.chat.messages
    prompt_bytes = sum(len(m.content.encode()) + len(m.tool_calls_json) for m in messages)
    prompt_bytes += len(msg.engine_fields_json)  # tool definitions and schemas, at most
    prompt_tokens = prompt_bytes // BYTES_PER_TOKEN + CHAT_TOKENS_PER_MESSAGE * len(messages)
    msg.sampling.max_tokens = max(1, min(cap, context - prompt_tokens))


# ------------------------------------------------------------------------------- answers

_RECEIPT_OPTIONAL = (
    "energy_j", "energy_j_low", "energy_j_high", "confidence", "waiting_j", "prefill_j", "decode_j",
    "postprocess_j", "idle_allocation_j", "batch_size", "padding_ratio", "prompt_tokens", "completion_tokens",
    "reused_tokens", "avoided_j", "carbon_g", "ttft_ms", "carbon_intensity_g_per_kwh", "embodied_g",
)


def receipt_object(receipt: EnergyReceipt) -> dict[str, Any]:
    """The receipt as JSON, with the field names of ``scheduler.v1.EnergyReceipt``."""
    out: dict[str, Any] = {
        "decision_id": receipt.decision_id, "request_id": receipt.request_id, "model": receipt.model,
        "region": receipt.region, "pool": receipt.pool, "pue": receipt.pue,
        "measurement_source": receipt.measurement_source, "attribution_method": receipt.attribution_method,
        "duration_ms": receipt.duration_ms, "partial": receipt.partial, "end_reason": receipt.end_reason,
        "carbon_basis": receipt.carbon_basis, "tickets_enforced": receipt.tickets_enforced,
    }
    if receipt.config_version:
        out["config_version"] = receipt.config_version
    if receipt.canary_arm:
        out["canary_arm"] = receipt.canary_arm
    if receipt.embodied_basis:
        out["embodied_basis"] = receipt.embodied_basis
    for name in _RECEIPT_OPTIONAL:
        value = getattr(receipt, name)
        if value is not None:
            out[name] = value
    if receipt.carbon is not None:
        signal = receipt.carbon.signal
        out["carbon_signal"] = {"zone": signal.key, "value": signal.value, "unit": signal.unit,
                                "observed_at_unix_s": signal.observed_at, "source": signal.source,
                                "age_s": receipt.carbon.age_s, "stale": receipt.carbon.stale,
                                "signal_type": signal.signal_type, "emission_factors": signal.emission_factors,
                                "estimated": signal.is_estimated,
                                "estimation_method": signal.estimation_method or ""}
    if receipt.fallbacks:
        out["fallbacks"] = [{"signal": f.signal, "scorer": f.scorer, "age_s": f.age_s, "max_age_s": f.max_age_s,
                             "detail": f.detail, "key": f.key, "bound": f.bound, "bound_unit": f.bound_unit,
                             "candidates": list(f.candidates)} for f in receipt.fallbacks]
    if receipt.failovers:
        out["failovers"] = [{"region": a.region, "pool": a.pool, "error": a.error, "http_status": a.http_status}
                            for a in receipt.failovers]
    return out


def receipt_headers(receipt: EnergyReceipt) -> tuple[tuple[str, str], ...]:
    """``x-energy-*`` headers for an answer that is not streamed."""
    headers = [("x-energy-decision-id", receipt.decision_id), ("x-energy-region", receipt.region),
               ("x-energy-pool", receipt.pool), ("x-energy-measurement", receipt.measurement_source),
               ("x-energy-carbon-basis", receipt.carbon_basis)]
    for name, value in (("x-energy-joules", receipt.energy_j), ("x-energy-joules-low", receipt.energy_j_low),
                        ("x-energy-joules-high", receipt.energy_j_high), ("x-energy-gco2e", receipt.carbon_g),
                        ("x-energy-confidence", receipt.confidence)):
        if value is not None:
            headers.append((name, f"{value:.6g}"))
    if receipt.config_version:
        headers.append(("x-energy-config-version", receipt.config_version))
    if receipt.canary_arm:
        headers.append(("x-energy-canary-arm", receipt.canary_arm))
    return tuple(headers)


def usage_object(usage: Mapping[str, Any] | None, receipt: EnergyReceipt | None) -> dict[str, Any]:
    """OpenAI's usage block: the region's counts, else the receipt's; the prompt tokens served
    from the prefix cache in ``prompt_tokens_details.cached_tokens``."""
    prompt = usage.get("prompt_tokens") if usage else None
    completion = usage.get("completion_tokens") if usage else None
    details = usage.get("prompt_tokens_details") if usage else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(prompt, int):
        prompt = (receipt.prompt_tokens if receipt else None) or 0
    if not isinstance(completion, int):
        completion = (receipt.completion_tokens if receipt else None) or 0
    if not isinstance(cached, int):
        cached = (receipt.reused_tokens if receipt else None) or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def tool_calls_of(deltas: list[Any]) -> list[dict[str, Any]]:
    """A stream's tool-call deltas (OpenAI's, in order) as the whole calls of a message: by
    index, the id, type and name they gave, their arguments joined."""
    calls: dict[int, dict[str, Any]] = {}
    for part in deltas:
        if not isinstance(part, dict):
            continue
        index = part.get("index")
        call = calls.setdefault(index if isinstance(index, int) else len(calls),
                                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        for key in ("id", "type"):
            if isinstance(part.get(key), str) and part[key]:
                call[key] = part[key]
        function = part.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                call["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]
    return [calls[index] for index in sorted(calls)]


@dataclass
class ChunkWriter:
    """Formats one streamed answer's SSE events."""

    call: OpenAiCall
    answer_id: str
    created: int = 0
    _role_sent: bool = False
    _text_chunk: tuple[bytes, bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())
        self._object = "chat.completion.chunk" if self.call.chat else "text_completion"
        self._prefix = ("chatcmpl-" if self.call.chat else "cmpl-") + self.answer_id
        # A completion's text chunk without a finish reason (all but the last): the same bytes
        # as ``_event`` makes, around the text, serialised once per stream (None: the marker
        # is not unique, as when the model's name holds it: every chunk is serialised whole).
        marker = orjson.dumps("\x00")
        parts = self._event([{"index": 0, "text": "\x00", "logprobs": None, "finish_reason": None}]).split(marker)
        self._text_chunk = (parts[0], parts[1]) if len(parts) == 2 else None

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": self._prefix, "object": self._object, "created": self.created, "model": self.call.model,
                "choices": choices, **extra}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def delta(self, delta: TextDelta) -> bytes:
        finish = delta.finish_reason or None
        if self.call.chat:
            # A delta that only calls tools has no content, as the engine sent it.
            content: dict[str, Any] = {"content": delta.text} if delta.text or not delta.delta_fields else {}
            if not self._role_sent:
                content["role"] = "assistant"
                self._role_sent = True
            if delta.delta_fields:
                content.update(delta.delta_fields)
            return self._event([{"index": 0, "delta": content, "logprobs": delta.logprobs, "finish_reason": finish}])
        if finish is None and delta.logprobs is None and self._text_chunk is not None:
            head, tail = self._text_chunk
            return head + orjson.dumps(delta.text) + tail
        return self._event([{"index": 0, "text": delta.text, "logprobs": delta.logprobs, "finish_reason": finish}])

    def usage(self, usage: Mapping[str, Any] | None, receipt: EnergyReceipt | None) -> bytes:
        """The usage chunk, the receipt in its ``usage`` (where OpenAI's clients keep it)."""
        block = usage_object(usage, receipt)
        if receipt is not None:
            block["energy_receipt"] = receipt_object(receipt)
        return self._event([], usage=block)

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"

    @staticmethod
    def receipt(receipt: EnergyReceipt) -> bytes:
        return b"event: energy_receipt\ndata: " + orjson.dumps({"energy_receipt": receipt_object(receipt)}) + b"\n\n"

    @staticmethod
    def error(message: str, kind: str, code: str) -> bytes:
        return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                                   "code": code}}) + b"\n\n"


def completion_object(call: OpenAiCall, answer_id: str, text: str, finish_reason: str,
                      usage: Mapping[str, Any] | None, receipt: EnergyReceipt | None,
                      delta_fields: Mapping[str, Any] | None = None,
                      logprobs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's (non-streamed) completion or chat completion object, with the receipt.
    ``delta_fields`` and ``logprobs``: the stream's, merged (``dispatch.merge_fields``)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish_reason or "stop"}
    if call.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        for name, value in (delta_fields or {}).items():
            message[name] = tool_calls_of(value) if name == "tool_calls" and isinstance(value, list) else value
        if message.get("tool_calls") and not text:
            message["content"] = None
        choice["message"] = message
    else:
        choice["text"] = text
    out: dict[str, Any] = {
        "id": ("chatcmpl-" if call.chat else "cmpl-") + answer_id,
        "object": "chat.completion" if call.chat else "text_completion",
        "created": int(time.time()), "model": call.model, "choices": [choice], "usage": usage_object(usage, receipt),
    }
    if receipt is not None:
        out["energy_receipt"] = receipt_object(receipt)
    return out
