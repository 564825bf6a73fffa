"""What turns tracing on: ``--otlp-endpoint``, else the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
(as is) or OTEL_EXPORTER_OTLP_ENDPOINT (a base URL) alone; without the SDK (the ``otlp`` extra)
the router says which extra to install; the router is importable without the SDK."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from scheduler.server.tracing import TracesEndpoint, TracingUnavailable, otlp_traces_url, traces_endpoint_from

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Case:
    name: str
    flag: str | None
    environ: dict[str, str]
    url: str | None


@pytest.mark.parametrize("case", [
    Case("nothing: off", None, {}, None),
    Case("the flag", "http://c:4318", {}, "http://c:4318/v1/traces"),
    Case("the flag wins over the variables", "http://flag:4318",
         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}, "http://flag:4318/v1/traces"),
    Case("the base variable gets /v1/traces", None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318/"},
         "http://env:4318/v1/traces"),
    Case("the traces variable is used as is", None,
         {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://env.example/otlp/traces",
          "OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"}, "https://env.example/otlp/traces"),
    Case("OTEL_SDK_DISABLED turns the variables off", None,
         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318", "OTEL_SDK_DISABLED": "true"}, None),
], ids=lambda c: c.name)
def test_what_turns_tracing_on(case: Case) -> None:
    found = traces_endpoint_from(case.flag, case.environ)
    url = None if found is None else otlp_traces_url(found.url, found.source, found.exact)
    assert url == case.url


def test_a_bad_variable_is_named() -> None:
    found = traces_endpoint_from(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
    assert found == TracesEndpoint("collector:4318", "OTEL_EXPORTER_OTLP_ENDPOINT")
    with pytest.raises(TracingUnavailable, match="OTEL_EXPORTER_OTLP_ENDPOINT: expected an http"):
        otlp_traces_url(found.url, found.source, found.exact)


# A Python without the SDK: a finder that refuses opentelemetry.sdk (the API stays).
NO_SDK = """
import importlib.abc, sys
class NoSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoSdk())
import scheduler.server.app, scheduler.server.cli  # the router imports without the SDK
from scheduler.server.tracing import TracingUnavailable, otlp_traces_url
try:
    otlp_traces_url("http://c:4318", "OTEL_EXPORTER_OTLP_ENDPOINT")
except TracingUnavailable as exc:
    print(exc)
"""


def test_without_the_sdk_the_router_imports_and_names_the_extra() -> None:
    done = subprocess.run([sys.executable, "-c", NO_SDK], capture_output=True, text=True, timeout=60, check=True)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on" in done.stdout
    assert "pip install 'carbon-scheduler[otlp]'" in done.stdout
