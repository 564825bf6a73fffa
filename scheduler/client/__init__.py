"""The Python SDK for the global router: ``SchedulerClient`` (blocking) and
``AsyncSchedulerClient`` (asyncio); typed errors in ``scheduler.client.errors``."""

from scheduler.client.aio import AsyncGeneration, AsyncSchedulerClient
from scheduler.client.common import DeferredAnswer, TlsConfig
from scheduler.client.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    SchedulerRpcError,
    UnauthenticatedError,
    UnavailableError,
    UnschedulableError,
)
from scheduler.client.sync import Generation, SchedulerClient
from scheduler.wire.retry import RetryPolicy

__all__ = [
    "AsyncGeneration",
    "AsyncSchedulerClient",
    "DeadlineExceededError",
    "DeferredAnswer",
    "Generation",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RetryPolicy",
    "SchedulerClient",
    "SchedulerRpcError",
    "TlsConfig",
    "UnauthenticatedError",
    "UnavailableError",
    "UnschedulableError",
]
