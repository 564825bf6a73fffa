"""Shared state: the ``StateStore`` protocol, ``RedisStore`` and ``MemoryStore``."""
