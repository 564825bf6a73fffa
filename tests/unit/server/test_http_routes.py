"""The HTTP front door's routes: exact paths, and templates with one parameter segment at the
end or in the middle (``/v1/deferred/{id}``, ``/v1/batches/{id}/cancel``)."""

from __future__ import annotations

import pytest

from scheduler.http.server import HttpRequest, HttpResponse
from scheduler.server.http_api import Routes

pytestmark = pytest.mark.timeout(30)


async def exact(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"exact")


async def status(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"status")


async def cancel(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"cancel")


ROUTES = Routes({("POST", "/v1/batches"): exact},
                {("GET", "/v1/batches/{id}"): status, ("POST", "/v1/batches/{id}/cancel"): cancel})


@pytest.mark.parametrize(("method", "path", "handler"), [
    ("POST", "/v1/batches", exact),
    ("GET", "/v1/batches/batch_1", status),
    ("POST", "/v1/batches/batch_1/cancel", cancel),
    ("GET", "/v1/batches/", None),  # an empty parameter
    ("GET", "/v1/batches/a/b", None),  # a parameter is one segment
    ("POST", "/v1/batches//cancel", None),
    ("DELETE", "/v1/batches/batch_1", None),
])
def test_a_path_finds_its_handler_or_none(method: str, path: str, handler: object) -> None:
    assert ROUTES.get((method, path)) is handler


def test_the_routes_list_their_templates() -> None:
    assert set(ROUTES) == {("POST", "/v1/batches"), ("GET", "/v1/batches/{id}"), ("POST", "/v1/batches/{id}/cancel")}
    assert len(ROUTES) == 3
