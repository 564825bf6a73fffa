"""``--log-format json``: one JSON object per log line, for log pipelines (Loki, Elasticsearch,
Cloud Logging) that index fields rather than parse text.

Fields: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, ``process`` (the pid: one
of a ``--workers`` router's processes), ``trace_id`` and ``span_id`` (32 and 16 hex digits) when
a span is current, and ``exception`` with the traceback when one is logged. The span comes from
``span_of`` (the router passes its request span, scheduler.server.edge); by default, from
OpenTelemetry's current context (an application that embeds the router and traces).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def otel_current_span() -> Span:
    """OpenTelemetry's current span (imported here: a command that logs text never loads it)."""
    from opentelemetry.trace import get_current_span

    return get_current_span()


class JsonFormatter(logging.Formatter):
    def __init__(self, span_of: Callable[[], Span] = otel_current_span) -> None:
        super().__init__()
        self.span_of = span_of

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        context = self.span_of().get_span_context()
        if context.is_valid:
            line["trace_id"] = f"{context.trace_id:032x}"
            line["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def use_log_format(log_format: str, span_of: Callable[[], Span] = otel_current_span) -> None:
    """Give the root logger's handlers the format named (``LOG_FORMATS``); ``ValueError`` naming
    the flag and the value for any other."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format: expected one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    formatter = JsonFormatter(span_of) if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(formatter)
