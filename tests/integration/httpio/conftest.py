"""Every test here runs twice: on asyncio's own event loop and on uvloop (the router runs on
uvloop; its transports are not asyncio's classes, which a plain-asyncio run would not show)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item,
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
