"""OpenAI's Batch API on the deferral queue (docs/http-front-door.md, "Batches").

- ``POST /v1/files`` (multipart form: ``purpose=batch``, ``file``: JSONL, one request a line:
  ``{"custom_id", "method": "POST", "url", "body"}``): the file, kept ``FILE_TTL_S``.
- ``POST /v1/batches`` (``input_file_id``, ``endpoint``: ``/v1/chat/completions`` or
  ``/v1/completions``, ``completion_window: "24h"``, ``metadata``): every line is checked
  (a bad one refuses the whole batch, naming its line and field, nothing held), then deferred
  (``Deferrals.defer``, a deferrable request whose deadline is the window's end), so each
  runs in the lowest-carbon window of its grid before it; its request id is
  ``{batch id}.{line number}``.
- ``GET /v1/batches/{id}``: its status and counts, read from its lines' deferred statuses.
- ``GET /v1/files/{id}/content``: an uploaded file's bytes, or a batch's output file (one line
  per answered request: OpenAI's completion object with its ``energy_receipt``) or error file
  (its failed, cancelled or lapsed requests), built from the lines' answers when asked (the
  deferral keeps an answer for a day: ``DeferralSettings.result_ttl_s``).
- ``POST /v1/batches/{id}/cancel``: its held requests are cancelled (those running finish).

What a tenant may keep: ``MAX_FILES`` files and ``MAX_BATCHES`` batches (each indexed by its
expiry in a per-tenant sorted set, no scan), a file at most the HTTP body limit, a batch at
most ``MAX_LINES`` requests, each request under the deferral's own caps (held requests, bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from google.protobuf import json_format

from scheduler import errors
from scheduler.deferral.queue import DONE, HELD, RUNNING
from scheduler.server import openai_front
from scheduler.server.auth import Principal
from scheduler.server.deferral_api import Deferrals
from scheduler.server.openai_front import deferred_request
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tickets import CHAT_COMPLETIONS, COMPLETIONS
from scheduler.v1 import router_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

WINDOW = "24h"
WINDOW_S = 86400.0
# An uploaded file, and a batch's record, are kept for the window and a day to read its output.
FILE_TTL_S = 2 * WINDOW_S
BATCH_TTL_S = 2 * WINDOW_S
MAX_FILES = 64
MAX_BATCHES = 64
MAX_LINES = 10_000
MAX_CUSTOM_ID_CHARS = 64
ENDPOINTS = {CHAT_COMPLETIONS: True, COMPLETIONS: False}
FILE_PREFIX, BATCH_PREFIX = "file-", "batch_"
# A batch's output and error files are named after it.
OUTPUT_PREFIX, ERROR_PREFIX = "file-out-", "file-err-"


def _scope(tenant: str) -> str:
    return urllib.parse.quote(tenant, safe="")


def file_key(tenant: str, file_id: str) -> str:
    return f"batch_file:{_scope(tenant)}:{file_id}"


def files_index(tenant: str) -> str:
    """A tenant's uploaded files by expiry (what its file cap counts)."""
    return f"batch_files:{_scope(tenant)}"


def batch_key(tenant: str, batch_id: str) -> str:
    return f"batch:{_scope(tenant)}:{batch_id}"


def batches_index(tenant: str) -> str:
    """A tenant's batches by expiry (what its batch cap counts)."""
    return f"batches:{_scope(tenant)}"


@dataclass(frozen=True)
class Line:
    """One request of a batch, as its record keeps it."""

    custom_id: str
    max_tokens: int


def _bad(field: str, description: str) -> errors.InvalidRequest:
    return errors.InvalidRequest([errors.FieldViolation(field, description)])


def multipart_fields(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body's fields: name -> (file name, bytes)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise _bad("body", f"expected multipart/form-data, got {content_type or 'no content-type'!r}")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"content-type: " + content_type.encode() + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise _bad("body", "not a multipart body")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str):
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


class Batches:
    """The Batch API's handlers' work; ``deferrals`` None: this router runs no deferral queue."""

    def __init__(self, store: StateStore, deferrals: Deferrals | None, clock: Callable[[], float],
                 fill_max_tokens: Callable[[Any], None]) -> None:
        self.store = store
        self.deferrals = deferrals
        self.clock = clock
        # Chat lines without max_tokens get the front door's default (openai_front.fill_chat_max_tokens).
        self.fill_max_tokens = fill_max_tokens

    def _deferrals(self) -> Deferrals:
        if self.deferrals is None:
            raise errors.Unavailable("this router does not run the deferral queue, which batches run on",
                                     retryable=False)
        return self.deferrals

    # --- files -----------------------------------------------------------------------------

    async def upload(self, principal: Principal, content_type: str, body: bytes) -> dict[str, Any]:
        fields = multipart_fields(content_type, body)
        purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
        if purpose != "batch":
            raise _bad("purpose", f"only purpose 'batch' is supported, got {purpose!r}")
        if "file" not in fields:
            raise _bad("file", "required")
        filename, content = fields["file"]
        now = self.clock()
        file_id = FILE_PREFIX + os.urandom(12).hex()
        meta = {"filename": filename or "batch.jsonl", "created_at": int(now), "purpose": purpose}
        await self._admit_into(principal.tenant, files_index(principal.tenant), file_id, now, FILE_TTL_S,
                               MAX_FILES, "files")
        await self._io(self.store.set(file_key(principal.tenant, file_id), orjson.dumps(meta) + b"\n" + content,
                                      FILE_TTL_S))
        return _file_object(file_id, meta, len(content))

    async def content(self, principal: Principal, file_id: str) -> bytes:
        """An uploaded file's bytes, or a batch's output or error file, built now."""
        for prefix, answered in ((OUTPUT_PREFIX, True), (ERROR_PREFIX, False)):
            if file_id.startswith(prefix):
                batch_id = file_id[len(prefix):]
                record = await self._record(principal, batch_id)
                statuses = await self._statuses(principal, batch_id, record)
                return b"".join(orjson.dumps(line) + b"\n"
                                for line in _output_lines(record, statuses, answered))
        stored: bytes | None = await self._io(self.store.get(file_key(principal.tenant, file_id)))
        if stored is None:
            raise errors.NotFound(f"no file {file_id!r} (unknown, expired, or another tenant's)")
        return stored.split(b"\n", 1)[1]

    # --- batches ---------------------------------------------------------------------------

    async def create(self, principal: Principal, body: Any, headers: Mapping[str, str]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _bad("body", "expected a JSON object")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise _bad("endpoint", f"expected one of {sorted(ENDPOINTS)}, got {endpoint!r}"[:200])
        if body.get("completion_window") != WINDOW:
            raise _bad("completion_window", f"only {WINDOW!r} is supported, got {body.get('completion_window')!r}"[:200])
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16 or not all(
                isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
            raise _bad("metadata", "expected at most 16 string pairs (keys up to 64, values up to 512 characters)")
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            raise _bad("input_file_id", "required")
        content = await self.content(principal, input_file_id) if input_file_id.startswith(FILE_PREFIX) else None
        if content is None:
            raise errors.NotFound(f"no file {input_file_id!r}")
        deferrals = self._deferrals()
        now = self.clock()
        batch_id = BATCH_PREFIX + os.urandom(12).hex()
        requests, lines = self._requests(content, endpoint, ENDPOINTS[endpoint], batch_id, now + WINDOW_S, headers)
        record = {"endpoint": endpoint, "input_file_id": input_file_id, "created_at": int(now),
                  "expires_at": int(now + WINDOW_S), "metadata": metadata, "cancelled_at": None,
                  "lines": [[line.custom_id, line.max_tokens] for line in lines]}
        await self._admit_into(principal.tenant, batches_index(principal.tenant), batch_id, now, BATCH_TTL_S,
                               MAX_BATCHES, "batches")
        await self._io(self.store.set(batch_key(principal.tenant, batch_id), orjson.dumps(record), BATCH_TTL_S))
        held = 0
        try:
            for request in requests:
                await deferrals.defer(principal, request)
                held += 1
        except Exception:
            # All of the batch or none of it: what was held is dropped, and the batch with it.
            # What cannot be dropped now lapses with its deadline; the first error is the answer.
            with contextlib.suppress(errors.SchedulerError):
                for request in requests[:held]:
                    await deferrals.cancel(principal, request.request.request_id)
                await self._io(self.store.delete(batch_key(principal.tenant, batch_id)))
                await self._io(self.store.zrem(batches_index(principal.tenant), [batch_id]))
            raise
        return _batch_object(batch_id, record, {HELD: len(lines)})

    def _requests(self, content: bytes, endpoint: str, chat: bool, batch_id: str, deadline: float,
                  headers: Mapping[str, str]) -> tuple[list[router_pb2.DeferRequest], list[Line]]:
        """Each line as a DeferRequest; ``InvalidRequest`` naming every bad line's fields."""
        rows = [row for row in content.splitlines() if row.strip()]
        if not rows:
            raise _bad("input_file_id", "the file has no requests")
        if len(rows) > MAX_LINES:
            raise _bad("input_file_id", f"at most {MAX_LINES:,} requests, got {len(rows):,}")
        bad: list[errors.FieldViolation] = []
        requests, lines, seen = [], [], set()
        for number, row in enumerate(rows, 1):
            where = f"input_file.line[{number}]"
            try:
                line = orjson.loads(row)
            except orjson.JSONDecodeError as exc:
                bad.append(errors.FieldViolation(where, f"not JSON: {exc}"[:200]))
                continue
            if not isinstance(line, dict):
                bad.append(errors.FieldViolation(where, "expected a JSON object"))
                continue
            custom_id = line.get("custom_id")
            if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS or custom_id in seen:
                bad.append(errors.FieldViolation(f"{where}.custom_id", f"expected a unique string of 1 to "
                                                 f"{MAX_CUSTOM_ID_CHARS} characters, got {custom_id!r}"[:200]))
                continue
            seen.add(custom_id)
            if line.get("method") != "POST" or line.get("url") != endpoint:
                bad.append(errors.FieldViolation(f"{where}.url", f"expected method POST and url {endpoint}, got "
                                                 f"{line.get('method')!r} {line.get('url')!r}"[:200]))
                continue
            body = line.get("body")
            if not isinstance(body, dict):
                bad.append(errors.FieldViolation(f"{where}.body", "expected a JSON object"))
                continue
            try:
                request = deferred_request({**body, "deadline": deadline}, headers, chat)
            except errors.InvalidRequest as exc:
                bad.extend(errors.FieldViolation(f"{where}.body.{v.field}", v.description) for v in exc.violations)
                continue
            self.fill_max_tokens(request.request)
            request.request.request_id = f"{batch_id}.{number}"
            requests.append(request)
            lines.append(Line(custom_id, request.request.sampling.max_tokens))
        if bad:
            raise errors.InvalidRequest(bad)
        return requests, lines

    async def get(self, principal: Principal, batch_id: str) -> dict[str, Any]:
        record = await self._record(principal, batch_id)
        statuses = await self._statuses(principal, batch_id, record)
        counts: dict[str, int] = {}
        for status in statuses:
            counts[status.state] = counts.get(status.state, 0) + 1
        return _batch_object(batch_id, record, counts)

    async def cancel(self, principal: Principal, batch_id: str) -> dict[str, Any]:
        record = await self._record(principal, batch_id)
        deferrals = self._deferrals()
        record["cancelled_at"] = record["cancelled_at"] or int(self.clock())
        await self._io(self.store.set(batch_key(principal.tenant, batch_id), orjson.dumps(record), BATCH_TTL_S))
        for status in await self._statuses(principal, batch_id, record):
            if status.state == HELD:
                await deferrals.cancel(principal, status.request_id)
        return await self.get(principal, batch_id)

    # --- the store -------------------------------------------------------------------------

    async def _record(self, principal: Principal, batch_id: str) -> dict[str, Any]:
        stored = await self._io(self.store.get(batch_key(principal.tenant, batch_id)))
        if stored is None:
            raise errors.NotFound(f"no batch {batch_id!r} (unknown, expired, or another tenant's)")
        record: dict[str, Any] = orjson.loads(stored)
        return record

    async def _statuses(self, principal: Principal, batch_id: str,
                        record: Mapping[str, Any]) -> list[router_pb2.DeferredStatus]:
        deferrals = self._deferrals()

        async def one(number: int) -> router_pb2.DeferredStatus:
            request_id = f"{batch_id}.{number}"
            try:
                return await deferrals.status(principal, request_id)
            except errors.NotFound:  # its answer lapsed
                return router_pb2.DeferredStatus(request_id=request_id, state="unknown",
                                                 error="NOT_FOUND: the answer is no longer kept")

        return list(await asyncio.gather(*(one(n) for n in range(1, len(record["lines"]) + 1))))

    async def _admit_into(self, tenant: str, index: str, member: str, now: float, ttl_s: float, cap: int,
                          what: str) -> None:
        """Count ``member`` in the tenant's ``index`` (members scored by expiry), within ``cap``."""
        lapsed = await self._io(self.store.zrange_by_score(index, high=now))
        if lapsed:
            await self._io(self.store.zrem(index, lapsed))
        if await self._io(self.store.zcard(index)) >= cap:
            raise errors.QuotaExceeded(tenant, f"batch {what}", cap, cap, what,
                                       f"tenant {tenant!r} keeps {cap} {what}, its cap; one must expire first")
        await self._io(self.store.zadd(index, {member: now + ttl_s}, ttl_s))

    @staticmethod
    async def _io(call: Any) -> Any:
        try:
            return await call
        except StateUnavailable as exc:
            raise errors.Unavailable(f"the state store is unreachable: {exc}", retry_after_s=1.0) from None


def _file_object(file_id: str, meta: Mapping[str, Any], size: int) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": meta["created_at"],
            "filename": meta["filename"], "purpose": meta["purpose"], "status": "processed"}


def _batch_object(batch_id: str, record: Mapping[str, Any], counts: Mapping[str, int]) -> dict[str, Any]:
    total = len(record["lines"])
    completed = counts.get(DONE, 0)
    pending = counts.get(HELD, 0) + counts.get(RUNNING, 0)
    failed = total - completed - pending
    cancelled = record["cancelled_at"] is not None
    status = ("cancelling" if pending else "cancelled") if cancelled else "in_progress" if pending else "completed"
    finished = status in ("completed", "cancelled")
    return {
        "id": batch_id, "object": "batch", "endpoint": record["endpoint"], "errors": None,
        "input_file_id": record["input_file_id"], "completion_window": WINDOW, "status": status,
        "output_file_id": OUTPUT_PREFIX + batch_id if finished and completed else None,
        "error_file_id": ERROR_PREFIX + batch_id if finished and failed else None,
        "created_at": record["created_at"], "in_progress_at": record["created_at"], "expires_at": record["expires_at"],
        "cancelled_at": record["cancelled_at"],
        "request_counts": {"total": total, "completed": completed, "failed": failed},
        "metadata": record["metadata"] or None,
    }


def _output_lines(record: Mapping[str, Any], statuses: list[router_pb2.DeferredStatus],
                  answered: bool) -> list[dict[str, Any]]:
    """The output file's lines (``answered``) or the error file's."""
    chat = record["endpoint"] == CHAT_COMPLETIONS
    out = []
    for (custom_id, max_tokens), status in zip(record["lines"], statuses, strict=True):
        line_id = f"batch_req_{status.request_id}"
        if status.state in (HELD, RUNNING) or (status.state == DONE) != answered:
            continue
        if status.state != DONE:
            code, _, message = (status.error or f"{status.state.upper()}: {status.detail}").partition(": ")
            out.append({"id": line_id, "custom_id": custom_id, "response": None,
                        "error": {"code": code.lower(), "message": message}})
            continue
        receipt = status.receipt
        call = openai_front.OpenAiCall(chat, receipt.model, stream=False, include_usage=False, remaining_s=None)
        finish = "length" if receipt.completion_tokens >= max_tokens else "stop"
        usage = {"prompt_tokens": receipt.prompt_tokens, "completion_tokens": receipt.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": receipt.reused_tokens}}
        body = openai_front.completion_object(call, status.request_id, status.text, finish, usage, None)
        body["energy_receipt"] = json_format.MessageToDict(receipt, preserving_proto_field_name=True)
        out.append({"id": line_id, "custom_id": custom_id,
                    "response": {"status_code": 200, "request_id": status.request_id, "body": body}, "error": None})
    return out
